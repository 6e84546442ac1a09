"""Virtual environments for the gates' tools, one per tool and pinned versions, reused while their pins hold.

Each gate runs a tool at upstream's pinned version in an environment of its own (as pre-commit gives each hook its
own), so that no tool's requirements meet another's: ruff, docformatter, codespell, mypy with torch 2.9.1's sources,
and the test environment of an old torch. An environment records the pip steps that made it; one whose steps differ
is made again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lightning_xpu.errors import ToolError

_RECORD = ".gates-steps.json"
# pip options of a step that installs torch: PyTorch's CPU index beside PyPI, whose Linux torch is a CUDA build, so
# that `torch==X` takes the CPU build `X+cpu` where that index is reachable (as tox.ini's install_command does), and
# PyPI's build where it is not (this project's CI), at the cost of one failed lookup a package (--retries 1)
TORCH_CPU_INDEX = ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--retries", "1"]


def _pip_env() -> dict[str, str]:
    # each environment pins its tools exactly: a machine-wide constraint (a cap on torch) must not refuse a pin
    return {**os.environ, "PIP_CONSTRAINT": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def ensure_venv(root: Path, name: str, steps: list[list[str]], log: list[str] | None = None) -> Path:
    """The Python of the environment ``root/NAME-HASH`` after ``pip install STEP`` for each step, made when missing.

    The hash is of the steps: environments for other pins (the master variant's base and the sdists' differ in their
    requirement ranges) live side by side. ``log`` collects a line per environment made (what it took).
    """
    venv = root / f"{name}-{hashlib.sha256(json.dumps(steps).encode()).hexdigest()[:8]}"
    python = venv / "bin" / "python"
    record = venv / _RECORD
    if python.is_file() and record.is_file() and json.loads(record.read_text()) == steps:
        return python
    if venv.exists():
        shutil.rmtree(venv)
    start = time.monotonic()
    # no pip of its own (ensurepip takes seconds per environment): this Python's pip installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    for step in steps:
        cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile", "--quiet", *step]
        proc = subprocess.run(cmd, env=_pip_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise ToolError(f"could not make the {name} environment (`pip install {' '.join(step)}`):\n{tail}")
    record.write_text(json.dumps(steps))
    if log is not None:
        log.append(f"{venv.name}: made in {time.monotonic() - start:.0f}s")
    return python


def executable(python: Path, name: str) -> str:
    """A console script of the environment whose Python is ``python``."""
    path = python.parent / name
    if not path.is_file():
        raise ToolError(f"{python.parent.parent} has no `{name}`; remove that environment and run again")
    return str(path)
