"""Harness for the emulator's tests.

The emulated devices are process-global (they patch torch.xpu and register dispatcher kernels), so each test
runs its body in a fresh Python process started with LIGHTNING_XPU_EMULATOR set; the pytest process itself never
enables the emulator and stays usable for every other test in the session (pytest-xdist included).
Child processes find the emulator through the repository's ``lightning_xpu_emulator.pth`` (processed by a
``sitecustomize`` on PYTHONPATH), exactly as an installed package does, so DDP workers they spawn get it too.
The native part is built once per session before the first test (``python -m lightning_xpu.emulator --build``
prebuilds it in CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def emulator_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose sitecustomize processes the repository's start-up .pth; also builds the native part."""
    from lightning_xpu import emulator

    emulator.build()
    site_dir = tmp_path_factory.mktemp("emulator_site")
    (site_dir / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(REPO_ROOT)!r})\n")
    return site_dir


@pytest.fixture
def run_emulated(emulator_site: Path, tmp_path: Path):
    """Run ``code`` in a new interpreter with N emulated devices; return its stdout (fails the test on error)."""

    def run(
        code: str,
        devices: int | None = 2,
        profile: str | None = None,
        timeout: float = 180,
        env: dict[str, str] | None = None,
    ) -> str:
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_XPU_EMULATOR", "ZE_"))}
        if "LIGHTNING_XPU_EMULATOR_CACHE" in os.environ:
            env["LIGHTNING_XPU_EMULATOR_CACHE"] = os.environ["LIGHTNING_XPU_EMULATOR_CACHE"]
        env["PYTHONPATH"] = os.pathsep.join([str(emulator_site), str(REPO_ROOT), env.get("PYTHONPATH", "")])
        env["PYTHONWARNINGS"] = "ignore"
        if devices is not None:
            env["LIGHTNING_XPU_EMULATOR"] = str(devices)
        if profile is not None:
            env["LIGHTNING_XPU_EMULATOR_DEVICE"] = profile
        env.update(extra)
        script = tmp_path / "body.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run(
            [sys.executable, str(script)],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            pytest.fail(f"emulated process failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr[-6000:]}")
        return proc.stdout

    return run
