"""ci/xpu_lines.py: the added source lines naming XPU outside the XPU modules, each explained by the reason table."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci.series_factory import FAKE_BASE, commit, init_repo, make_series

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "xpu_lines.py"
AWK = [Path(__file__).resolve().parents[3] / "shared" / "tools" / "series_shape.awk",
       Path("/work/shared/tools/series_shape.awk")]
CALC = FAKE_BASE["src/lightning/fabric/calc.py"]
TABLE = """
[[line]]
file = "src/lightning/fabric/calc.py"
pattern = 'DEVICES'
counterpart = '`"cuda"` in the same tuple'

[[line]]
file = "src/lightning/fabric/calc.py"
pattern = 'xccl|Intel XPUs'
reason = "XPU's backend"
"""


def _series(tmp_path: Path) -> Path:
    repo = tmp_path / "ws"
    init_repo(repo, FAKE_BASE)
    commit(repo, "fabric: devices", {
        "src/lightning/fabric/calc.py": CALC + '\n\nDEVICES = ("cuda", "xpu")\n# the xpu needs this comment\n'
        'def backend():\n    """The backend of Intel XPUs."""\n    return "xccl"\n',
        "src/lightning/fabric/accelerators/xpu.py": 'XPU = "xpu"\n',  # an XPU module: not counted
        "src/lightning/fabric/CHANGELOG.md": "- Added XPU\n",
        "tests/tests_fabric/test_calc.py": 'def test_xpu():\n    assert "xpu"\n',
    })
    commit(repo, "fabric: more devices", {
        "src/lightning/fabric/calc.py": CALC + '\n\nDEVICES = ("cuda", "mps", "xpu")\n# the xpu needs this comment\n'
        'def backend():\n    """The backend of Intel XPUs."""\n    return "xccl"\n'})
    return make_series(repo, "HEAD~2", tmp_path / "patches")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_lists_the_lines_per_patch_and_checks_each_has_a_reason(tmp_path):
    series, table = _series(tmp_path), tmp_path / "table.toml"
    table.write_text(TABLE)
    proc = _run("--series", str(series), "--table", str(table))
    assert proc.returncode == 0, proc.stderr
    assert "src/lightning/fabric/calc.py: 4\n" in proc.stdout  # the comment, the XPU module, tests, CHANGELOG: no
    assert '[ 2] DEVICES = ("cuda", "mps", "xpu")' in proc.stdout  # a changed line counts again in its patch
    assert "4 lines in 1 files; 0 unexplained" in proc.stdout
    assert _run("--series", str(series), "--table", str(table), "--check").returncode == 0

    table.write_text(TABLE.replace("pattern = 'xccl|Intel XPUs'", "pattern = 'xccl'"))
    proc = _run("--series", str(series), "--table", str(table), "--check")
    assert proc.returncode == 1
    assert 'UNEXPLAINED src/lightning/fabric/calc.py (patch 1): """The backend of Intel XPUs."""' in proc.stdout

    table.write_text(TABLE + '\n[[line]]\nfile = "src/lightning/fabric/gone.py"\npattern = "xpu"\nreason = "old"\n')
    proc = _run("--series", str(series), "--table", str(table), "--check")
    assert proc.returncode == 1
    assert "STALE table.toml: no added line of src/lightning/fabric/gone.py matches 'xpu'" in proc.stdout


def test_markdown_is_what_the_cover_letter_carries(tmp_path):
    series, table = _series(tmp_path), tmp_path / "table.toml"
    table.write_text(TABLE)
    markdown = _run("--series", str(series), "--table", str(table), "--markdown").stdout.strip()
    assert markdown.startswith("4 added lines of source outside the XPU modules name XPU, in 1 files")
    assert '| `fabric/calc.py` | 2 | `DEVICES = ("cuda", "xpu")` | beside `"cuda"` in the same tuple |' in markdown
    assert "| `fabric/calc.py` | 2 | `\"\"\"The backend of Intel XPUs.\"\"\"` | XPU's backend |" in markdown

    cover = tmp_path / "COVER.md"
    cover.write_text("# Cover\n\nNo table yet.\n")
    proc = _run("--series", str(series), "--table", str(table), "--check-cover", str(cover))
    assert proc.returncode == 2 and "has no xpu-lines block" in proc.stderr
    begin = "<!-- xpu-lines: the output of `python ci/xpu_lines.py --markdown`; --check-cover compares it -->"
    cover.write_text(f"# Cover\n\n{begin}\n{markdown}\n<!-- /xpu-lines -->\n\nMore.\n")
    assert _run("--series", str(series), "--table", str(table), "--check-cover", str(cover)).returncode == 0
    cover.write_text(cover.read_text().replace("| 2 |", "| 3 |", 1))
    proc = _run("--series", str(series), "--table", str(table), "--check-cover", str(cover))
    assert proc.returncode == 1 and "is not the script's" in proc.stdout


@pytest.mark.skipif(not any(p.is_file() for p in AWK) or shutil.which("awk") is None,
                    reason="needs the developers' shared/tools/series_shape.awk (not in this repository) and awk")
def test_counts_the_lines_series_shape_awk_counts(tmp_path):
    series = _series(tmp_path)
    awk = next(p for p in AWK if p.is_file())
    shape = subprocess.run(["awk", "-f", str(awk), *sorted(map(str, series.glob("*.patch")))], capture_output=True,
                           text=True, check=True).stdout
    wide = int(re.search(r"outside the xpu modules: (\d+) in", shape).group(1))
    listing = _run("--series", str(series), "--table", "/dev/null").stdout
    assert f"{wide} lines in 1 files" in listing
