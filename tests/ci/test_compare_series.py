"""The comparison of the release series with its master variant names every change that differs, and only those."""

import subprocess
import sys
from pathlib import Path

from ci.compare_series import compare, render
from tests.ci.series_factory import FAKE_BASE, commit, init_repo, make_series

COMPARE = Path(__file__).resolve().parents[2] / "ci" / "compare_series.py"
CALC = "src/lightning/fabric/calc.py"
LOG = "src/lightning/fabric/CHANGELOG.md"


def _series(tmp_path: Path) -> tuple[Path, Path]:
    """Two series of the same three patches: the release one on the base, the master one on a moved-on base."""
    release = tmp_path / "release"
    init_repo(release, {**FAKE_BASE, LOG: "## Unreleased\n\n-\n"})
    commit(release, "fabric: add sub", {CALC: FAKE_BASE[CALC] + "\n\ndef sub(a, b):\n    return a - b\n",
                                        LOG: "## Unreleased\n\n- Added `sub`\n"})
    commit(release, "fabric: add mul", {CALC: FAKE_BASE[CALC].replace("a + b", "a + b  # add") +
                                        "\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"})
    commit(release, "fabric: docs", {"docs/calc.rst": "calc\n"})

    master = tmp_path / "master"
    moved = FAKE_BASE[CALC].replace('"""Arithmetic."""', '"""Arithmetic, upstream."""')
    init_repo(master, {**FAKE_BASE, CALC: moved, LOG: "## Unreleased\n\n- Upstream's entry\n",
                       "tests/test_registry.py": "NAMES = {'cpu'}\n"})
    commit(master, "fabric: add sub", {CALC: moved + "\n\ndef sub(a, b):\n    return a - b\n",
                                       LOG: "## Unreleased\n\n- Upstream's entry\n\n- Added `sub`\n",
                                       "tests/test_registry.py": "NAMES = {'cpu', 'sub'}\n"})
    commit(master, "fabric: add mul", {CALC: moved.replace("a + b", "a.__add__(b)  # add") +
                                       "\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"})
    commit(master, "fabric: docs", {"docs/calc.rst": "calc\n"})
    return make_series(release, "HEAD~3", tmp_path / "patches"), make_series(master, "HEAD~3", tmp_path / "pm")


def test_reports_each_difference_and_nothing_else(tmp_path):
    release, master = _series(tmp_path)
    result = compare(release, master)
    assert [p.identical for p in result.pairs] == [False, False, True]
    sub, mul, _ = result.pairs
    # the CHANGELOG entry is the same, only its place differs; the registry edit exists only on master
    assert sub.blocks == [] and [path for path, _ in sub.master_only_files] == ["tests/test_registry.py"]
    assert mul.blocks == [(CALC, [("-    return a + b", "+    return a + b  # add")],
                           [("-    return a + b", "+    return a.__add__(b)  # add")])]
    assert result.release_only == result.master_only == []
    text = render(result)
    assert "- 3 patches in both series, 1 of them with identical changes" in text
    assert "`tests/test_registry.py`: changed only on master (+1 -1 lines)" in text
    assert "+    return a.__add__(b)  # add" in text and "0003-fabric-docs.patch" not in text


def test_unpaired_patches_are_listed(tmp_path):
    release, master = _series(tmp_path)
    (master / "series").write_text("".join(n + "\n" for n in (master / "series").read_text().split()[:2]))
    result = compare(release, master)
    assert result.release_only == ["0003-fabric-docs.patch"] and result.master_only == []


def test_check_fails_on_a_stale_report(tmp_path):
    release, master = _series(tmp_path)
    stored = tmp_path / "DIFFERENCES.md"
    args = [sys.executable, str(COMPARE), "--release", str(release), "--master", str(master)]
    assert subprocess.run([*args, "--check", str(stored)], capture_output=True).returncode == 1
    assert subprocess.run([*args, "--write", str(stored)], capture_output=True).returncode == 0
    proc = subprocess.run([*args, "--check", str(stored)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    stored.write_text(stored.read_text().replace("identical", "same"))
    proc = subprocess.run([*args, "--check", str(stored)], capture_output=True, text=True)
    assert proc.returncode == 1 and "--write" in proc.stderr


def test_a_test_file_folded_into_its_namesake_is_compared_by_its_code(tmp_path):
    body = "\n\ndef test_sub():\n    assert sub(3, 2) == 1\n"
    release = tmp_path / "release"
    init_repo(release, FAKE_BASE)
    commit(release, "fabric: test sub", {"tests/test_calc_xpu.py": '"""Header."""\n\nfrom calc import sub\n' + body})
    master = tmp_path / "master"
    init_repo(master, {**FAKE_BASE, "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    pass\n"})
    commit(master, "fabric: test sub", {"tests/test_calc.py": "from calc import add, sub\n\n\ndef test_add():\n"
                                        "    pass\n" + body})
    same = compare(make_series(release, "HEAD~1", tmp_path / "p1"), make_series(master, "HEAD~1", tmp_path / "p2"))
    assert same.pairs[0].identical and same.pairs[0].folded == [("tests/test_calc_xpu.py", "tests/test_calc.py")]
    commit(master, "fabric: test sub", {"tests/test_calc.py": "from calc import add, sub\n\n\ndef test_add():\n"
                                        "    pass\n" + body.replace("== 1", "== 2")})
    differs = compare(make_series(release, "HEAD~1", tmp_path / "p3"), make_series(master, "HEAD~2", tmp_path / "p4"))
    assert not differs.pairs[0].identical
    assert differs.pairs[0].blocks[0][0] == "tests/test_calc_xpu.py -> tests/test_calc.py"
