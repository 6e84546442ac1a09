"""bisect and lint on a series made against an upstream commit: with a checkout they use it, without one they say
what they leave out."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci.series_factory import FAKE_BASE, commit, git, init_repo, make_series

CI = Path(__file__).resolve().parents[2] / "ci"
RUFF = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
CONFTEST = "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n"
TEST_CALC = "from lightning.fabric.calc import add\n\n\ndef test_add(two):\n    assert add(two, 3) == 5\n"


def _upstream_series(tmp_path: Path) -> tuple[Path, Path]:
    """Upstream with its own tests and conftest, and a series against its HEAD: a new module, a broken add, a fix."""
    upstream = tmp_path / "upstream"
    init_repo(upstream, {**FAKE_BASE, "tests/tests_fabric/__init__.py": "", "tests/tests_fabric/conftest.py": CONFTEST,
                         "tests/tests_fabric/test_calc.py": TEST_CALC})
    work = tmp_path / "work"
    git(tmp_path, "clone", "-q", str(upstream), str(work))
    commit(work, "fabric: add neg", {"src/lightning/fabric/neg.py": "import os\n\n\ndef neg(a):\n    return -a\n",
                                     "tests/tests_fabric/test_neg.py": "from lightning.fabric.neg import neg\n\n\n"
                                     "def test_neg(two):\n    assert neg(two) == -2\n"})
    calc = FAKE_BASE["src/lightning/fabric/calc.py"]
    more = TEST_CALC + "\n\ndef test_more():\n    pass\n"
    commit(work, "fabric: break add", {"src/lightning/fabric/calc.py": calc.replace("a + b", "a - b"),
                                       "tests/tests_fabric/test_calc.py": more})
    series = make_series(work, "HEAD~2", tmp_path / "patches")
    (series / "base.toml").write_text('[upstream]\nrepository = "https://example.invalid/up"\nref = "main"\n'
                                      f'commit = "{git(upstream, "rev-parse", "HEAD").strip()}"\n')
    return upstream, series


def _run(script: str, series: Path, checkout: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_UPSTREAM_CHECKOUT"}
    env["PATH"] = f"{Path(RUFF).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    if checkout:
        env["LIGHTNING_UPSTREAM_CHECKOUT"] = str(checkout)
    return subprocess.run([sys.executable, str(CI / script), "--series", str(series), *(
        ["--workers", "0"] if script.startswith("bisect") else [])], capture_output=True, text=True, env=env,
        timeout=300)


def test_bisect_runs_upstreams_tests_of_each_prefix_or_says_why_not(tmp_path):
    upstream, series = _upstream_series(tmp_path)
    proc = _run("bisect_series.py", series, None)
    assert proc.returncode == 0 and proc.stdout.startswith("bisect: skipped:") and "LIGHTNING_UPSTREAM_CHECKOUT" in (
        proc.stdout)
    proc = _run("bisect_series.py", series, upstream)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # prefix 1 runs the test it adds, with upstream's conftest fixture; prefix 2 breaks upstream's test_add
    assert "[1/2] ok" in proc.stdout and "[1 passed]" in proc.stdout
    assert "FIRST BROKEN PATCH: 2/2 0002-fabric-break-add.patch" in proc.stdout
    assert "FAILED tests_fabric.test_calc::test_add" in proc.stdout


@pytest.mark.skipif(not Path(RUFF).is_file(), reason="needs ruff; `tox -e ci` installs it")
def test_lint_without_a_checkout_lints_only_the_created_files(tmp_path):
    upstream, series = _upstream_series(tmp_path)
    proc = _run("lint_patches.py", series, None)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "src/lightning/fabric/neg.py:1:8: F401" in proc.stdout
    assert "2 Python files the series creates; 1 ruff finding(s)" in proc.stdout
    assert "Not linted: its changes to 2 existing upstream files" in proc.stdout
    proc = _run("lint_patches.py", series, upstream)
    assert proc.returncode == 1 and "4 Python files touched by 2 patches; 1 ruff finding(s)" in proc.stdout
