"""apply --installed / --revert on a throwaway virtual environment (never the one running the tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_xpu.base import Base

from .conftest import REPO, make_venv, tree_digest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine_wheels(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Unmodified 2.6.6 wheels built from the pinned sdists (what `pip install lightning==2.6.6` installs)."""
    out = tmp_path_factory.mktemp("pristine-dist")
    env = {k: v for k, v in os.environ.items() if k != "PACKAGE_NAME"}
    copies = {name: out / "src" / tree.name for name, tree in trees.items()}
    for name, tree in trees.items():  # pip builds in the tree: never in the shared cache
        shutil.copytree(tree, copies[name])
    procs = [subprocess.Popen([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                               "--no-index", "-w", str(out / "whl" / name), str(tree)], env=env)
             for name, tree in copies.items()]
    assert [p.wait() for p in procs] == [0, 0, 0]
    return sorted(out.glob("whl/*/*.whl"))


@pytest.fixture
def venv(pristine_wheels: list[Path], tmp_path: Path) -> tuple[Path, Path]:
    python = make_venv(tmp_path / "venv")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    *map(str, pristine_wheels)], check=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    return python, site


def cli(python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([str(python), "-m", "lightning_xpu", *args], capture_output=True, text=True, env=env)


def versions(python: Path) -> dict[str, str]:
    probe = (
        "import json, lightning, lightning_fabric, pytorch_lightning, lightning.fabric as f, lightning.pytorch as p;"
        "mods = (lightning, f, p, lightning_fabric, pytorch_lightning);"
        "print(json.dumps({m.__name__: m.__version__ for m in mods}))"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_installed_then_revert_restores_site_packages_byte_for_byte(venv: tuple[Path, Path],
                                                                    fake_series_dir: Path) -> None:
    python, site = venv
    pristine = tree_digest(site)
    assert set(versions(python).values()) == {"2.6.6"}

    proc = cli(python, "apply", "--installed", "--check", "--series", str(fake_series_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Would patch lightning, pytorch_lightning, lightning_fabric")
    assert tree_digest(site) == pristine

    proc = cli(python, "apply", "--installed", "--series", str(fake_series_dir))
    assert proc.returncode == 0, proc.stderr
    assert set(versions(python).values()) == {"2.6.6+xpu.3"}
    for root in ("lightning/fabric", "lightning_fabric"):
        assert (site / root / "utilities" / "xpu_fake.py").is_file()
    manifest = json.loads((site / ".lightning-xpu-backup" / "manifest.json").read_text())
    assert manifest["series_version"] == 3

    doctor = cli(python, "doctor")
    assert doctor.returncode == json.loads(cli(python, "doctor", "--json").stdout)["verdict"]["exit_status"]
    assert "2.6.6+xpu.3 [patched in place, series version 3" in doctor.stdout, doctor.stdout

    again = cli(python, "apply", "--installed", "--series", str(fake_series_dir))
    assert again.returncode == 1 and "already patched (series version 3)" in again.stderr

    proc = cli(python, "apply", "--installed", "--revert")
    assert proc.returncode == 0, proc.stderr
    assert tree_digest(site) == pristine
    assert set(versions(python).values()) == {"2.6.6"}


def test_wrong_base_is_refused_and_nothing_changes(venv: tuple[Path, Path], fake_series_dir: Path) -> None:
    python, site = venv
    edited = site / "pytorch_lightning" / "trainer" / "trainer.py"
    edited.write_text(edited.read_text() + "# local edit\n")
    before = tree_digest(site)
    proc = cli(python, "apply", "--installed", "--series", str(fake_series_dir))
    assert proc.returncode == 1
    assert "the installed pytorch_lightning" in proc.stderr
    assert "trainer/trainer.py differs from the 2.6.6 sdist" in proc.stderr
    assert tree_digest(site) == before


def test_revert_without_apply_is_refused(venv: tuple[Path, Path]) -> None:
    python, site = venv
    before = tree_digest(site)
    proc = cli(python, "apply", "--installed", "--revert")
    assert proc.returncode == 1 and "nothing to revert" in proc.stderr
    assert tree_digest(site) == before


def test_revert_refuses_files_changed_after_patching(venv: tuple[Path, Path], fake_series_dir: Path) -> None:
    python, site = venv
    assert cli(python, "apply", "--installed", "--series", str(fake_series_dir)).returncode == 0
    changed = site / "lightning" / "fabric" / "accelerators" / "cuda.py"
    changed.write_text("# overwritten\n")
    proc = cli(python, "apply", "--installed", "--revert")
    assert proc.returncode == 1 and "changed after it was patched" in proc.stderr
    assert changed.read_text() == "# overwritten\n"


def test_nothing_installed_is_a_clear_error(tmp_path: Path, base: Base) -> None:
    python = make_venv(tmp_path / "venv")
    proc = cli(python, "apply", "--installed")
    # The parent environment may have Lightning installed; only then is it visible through the .pth file.
    import importlib.util

    if importlib.util.find_spec("lightning") is None:
        assert proc.returncode == 1
        assert "no lightning, pytorch_lightning or lightning_fabric is installed" in proc.stderr
    else:
        assert proc.returncode == 1
