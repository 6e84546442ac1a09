"""ci/main-job.sh installs the torch build asked for, even into a .venv that has another one.

The venv is fake: its ``python`` and ``lightning-xpu`` are shell scripts that log their arguments and keep the
installed torch's version in a file, so the job runs in a second without installing anything.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

FAKE_PYTHON = r"""#!/usr/bin/env bash
# pip, `import torch` and the training script of a fake venv; the installed torch is $STATE.
here="$(dirname "$0")"
state="$here/../torch-version"
echo "python $*" >> "$here/../log"
build() { cat "$state" 2>/dev/null; }
if [ "$1" = "-c" ]; then
    case "$2" in
        *is_available*|*_is_compiled*) [[ "$(build)" == *+xpu ]] ;;
        *device_count*) echo 1 ;;
        *"version('torch')"*) [ -f "$state" ] && build ;;
        *) exit 0 ;;
    esac
    exit $?
fi
if [ "$1 $2" = "-m pip" ]; then
    shift 2
    args=" $* "
    if [[ "$args" == *" uninstall "* ]]; then rm -f "$state"
    elif [[ "$args" == *" install torch --index-url "* ]]; then echo "2.13.0+${args##*/}" | tr -d ' ' > "$state"
    elif [[ "$args" == *" torch==2.13.0+cpu "* ]]; then echo "2.13.0+cpu" > "$state"
    fi
fi
exit 0
"""
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
FAKE_TOOL = r"""#!/usr/bin/env bash
echo "lightning-xpu $*" >> "$(dirname "$0")/../log"
if [ "$1" = doctor ] && [ -n "${LIGHTNING_XPU_EMULATOR:-}" ]; then exit 3; fi
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A fake venv holding a torch installed by someone else (2.13.0+cpu, no record of where it came from)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("lightning-xpu", FAKE_TOOL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "venv" / "torch-version").write_text("2.13.0+cpu\n")
    return tmp_path / "venv"


def _main_job(venv: Path, index_url: str | None) -> tuple[str, list[str]]:
    (venv / "log").unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "LIGHTNING_XPU_EMULATOR")}
    env["LIGHTNING_XPU_VENV"] = str(venv)
    if index_url is not None:
        env["TORCH_INDEX_URL"] = index_url
    proc = subprocess.run(["bash", str(REPO / "ci" / "main-job.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pip = [line.split(" --quiet ", 1)[1] for line in (venv / "log").read_text().splitlines() if " -m pip " in line]
    return proc.stdout, pip


def test_torch_is_not_imported_before_lightnings_requirements_bring_numpy(venv: Path) -> None:
    # torch 2.13's CPU wheel does not require numpy: importing it earlier prints "Failed to initialize NumPy"
    _main_job(venv, None)
    log = (venv / "log").read_text().splitlines()
    first_import = next(i for i, line in enumerate(log) if re.match(r"python -c import [\w, ]*\btorch\b", line))
    assert first_import > log.index("lightning-xpu build --install")


def test_the_index_url_replaces_a_torch_the_venv_already_has(venv: Path) -> None:
    xpu = "https://download.pytorch.org/whl/xpu"
    out, pip = _main_job(venv, xpu)
    assert "Replacing torch 2.13.0+cpu" in out
    assert pip[:2] == ["uninstall -y torch", f"install torch --index-url {xpu}"]
    assert (venv / "torch-version").read_text() == "2.13.0+xpu\n"
    assert "Training on 1 real Intel GPU(s)." in out

    _, pip = _main_job(venv, xpu)  # asked for again: kept
    assert not [p for p in pip if "torch" in p]

    out, pip = _main_job(venv, None)  # the default asks for the CPU build, from PyTorch's CPU index or find-links
    assert pip[:2] == ["uninstall -y torch", f"install --retries 1 --extra-index-url {CPU_INDEX} torch==2.13.0+cpu"]
    assert "training on 2 EMULATED XPU devices" in out

    (venv / "torch-version").write_text("2.14.1+cpu\n")  # someone installed another torch since
    _, pip = _main_job(venv, None)
    assert pip[:2] == ["uninstall -y torch", f"install --retries 1 --extra-index-url {CPU_INDEX} torch==2.13.0+cpu"]
