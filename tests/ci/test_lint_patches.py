"""The lint check reports what the series adds against upstream's ruff rules, not upstream's own findings."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci.series_factory import FAKE_BASE, commit, init_repo, make_series, write

LINT = Path(__file__).resolve().parents[2] / "ci" / "lint_patches.py"
RUFF = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")

pytestmark = pytest.mark.skipif(not Path(RUFF).is_file(), reason="needs ruff; `tox -e ci` installs it")

# upstream's base file already breaks a rule (E501); the series must not be blamed for it
BASE = {**FAKE_BASE, "src/lightning/fabric/old.py": f"X = '{'x' * 130}'\n"}


def test_reports_the_series_findings_and_leaves_upstreams_out(tmp_path):
    repo = tmp_path / "ws"
    init_repo(repo, BASE)
    commit(repo, "fabric: add helpers", {
        "src/lightning/fabric/helpers.py": "import os\n\n\ndef f(x):\n    return x\n",  # F401
        "src/lightning/fabric/old.py": f"X = '{'x' * 130}'\nY = 1\n",
        "tests/tests_fabric/test_helpers.py": "def test_f( ):\n    assert True\n",  # not formatted
    })
    series = make_series(repo, "HEAD~1", tmp_path / "patches")
    base = tmp_path / "base"
    write(base, BASE)
    proc = subprocess.run([sys.executable, str(LINT), "--series", str(series), "--base-tree", str(base)],
                          capture_output=True, text=True, env={"PATH": f"{Path(RUFF).parent}:/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "src/lightning/fabric/helpers.py:1:8: F401 `os` imported but unused" in proc.stdout
    assert "old.py" not in proc.stdout  # its long line is upstream's
    assert "tests/tests_fabric/test_helpers.py: not formatted" in proc.stdout
    assert "3 Python files touched by 1 patches; 1 ruff finding(s), 1 file(s) to reformat" in proc.stdout
