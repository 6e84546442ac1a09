"""The replay check applies the series onto an upstream git history and reports what changed."""

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

from ci.replay_upstream import default_refs
from tests.ci.series_factory import commit, git, init_repo, make_series

REPLAY = Path(__file__).resolve().parents[2] / "ci" / "replay_upstream.py"

CALC = ['"""Arithmetic."""', "", "", "def add(a, b):", "    return a + b", "", "", "def sub(a, b):",
        "    return a - b", "", "", "def mul(a, b):", "    return a * b", "", "", "def div(a, b):", "    return a / b"]
TESTS = ("from lightning.fabric.calc import add, div, mul, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_sub():\n    assert sub(2, 3) == -1\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n\n\n"
         "def test_div():\n    assert div(3, 2) == 1.5\n")
STATE_TEST = """import pathlib


def test_no_leftover_state():
    marker = pathlib.Path(__file__).parent / "leftover"
    leftover = marker.exists()
    marker.unlink(missing_ok=True)
    assert not leftover
"""
SRC = {"src/lightning/__init__.py": "", "src/lightning/fabric/__init__.py": "",
       "src/lightning/fabric/CHANGELOG.md": "# Changelog\n\n## Unreleased\n\n## 1.0.0\n\n- First release\n"}
CHANGELOG = "src/lightning/fabric/CHANGELOG.md"


def calc(**lines: str) -> str:
    """CALC with some 1-based lines replaced, e.g. ``calc(l13="    return a * b + 1")``."""
    text = list(CALC)
    for key, line in lines.items():
        text[int(key[1:]) - 1] = line
    return "\n".join(text) + "\n"


def _upstream_and_series(tmp_path: Path) -> tuple[Path, Path]:
    """An upstream history (tag 1.0.0, then master) and a series made against the 1.0.0 sources.

    On master, patch 2's context moved (a 3-way merge fixes that) and patch 3's line was rewritten (a conflict);
    patch 1's CHANGELOG entry conflicts with another one there. Patch 2 breaks upstream's ``test_mul``; patch 1 adds
    a module and a test of its own.
    """
    upstream = tmp_path / "upstream"
    # like upstream: pytest's rootdir is the repository root, so JUnit ids start with `tests.`
    init_repo(upstream, {**SRC, "src/lightning/fabric/calc.py": calc(), "tests/__init__.py": "",
                         "pyproject.toml": "[tool.pytest.ini_options]\naddopts = []\n",
                         "tests/tests_fabric/__init__.py": "", "tests/tests_fabric/test_calc.py": TESTS,
                         "tests/tests_fabric/test_state.py": STATE_TEST})
    git(upstream, "tag", "1.0.0")
    commit(upstream, "later upstream work", {"src/lightning/fabric/calc.py": calc(
        l16="def div(a, b):  # true division", l9="    return a.__sub__(b)"),
        CHANGELOG: SRC[CHANGELOG].replace("## Unreleased\n", "## Unreleased\n\n- Faster `div`\n")})

    workspace = tmp_path / "workspace"  # the sdist: sources only, no tests
    init_repo(workspace, {**SRC, "src/lightning/fabric/calc.py": calc()})
    entry = SRC[CHANGELOG].replace("## Unreleased\n", "## Unreleased\n\n- Add `neg`\n")
    # importing the series' test leaves state behind that upstream's test_state trips over when run in one session
    test_neg = ("import pathlib\n\nfrom lightning.fabric.neg import neg\n\n"
                "(pathlib.Path(__file__).parent / 'leftover').touch()\n\n\n"
                "def test_neg():\n    assert neg(2) == -2\n\n\n"
                "def test_neg_uses_a_fixture_upstream_lacks(xpu_count_1):\n    pass\n")
    commit(workspace, "fabric: add neg", {"src/lightning/fabric/neg.py": "def neg(a):\n    return -a\n",
                                          CHANGELOG: entry, "tests/tests_fabric/test_neg.py": test_neg})
    commit(workspace, "fabric: change mul", {"src/lightning/fabric/calc.py": calc(l13="    return a * b + 1")})
    commit(workspace, "fabric: change sub", {"src/lightning/fabric/calc.py": calc(
        l13="    return a * b + 1", l9="    return -(b - a)"), "src/lightning/fabric/sub.py": "from .calc import *\n"})
    series = make_series(workspace, "HEAD~3", tmp_path / "patches")
    git(workspace, "checkout", "-q", "HEAD~3")  # the workspace's base is the sdist the series was made against
    return upstream, series


def _replay(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPLAY), *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_reports_clean_three_way_conflict_and_changed_tests(tmp_path):
    upstream, series = _upstream_and_series(tmp_path)
    before = git(upstream, "rev-parse", "HEAD")
    report = tmp_path / "report.json"
    proc = _replay("--checkout", str(upstream), "--series", str(series), "--ref", "1.0.0", "--ref", "main",
                   "--workers", "0", "--json", str(report), "--base-tree", str(tmp_path / "workspace"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    tag, main = json.loads(report.read_text())
    assert [p["result"] for p in tag["patches"]] == ["clean", "clean", "clean"]
    assert [p["result"] for p in main["patches"]] == ["CONFLICT", "3-way", "CONFLICT"]
    assert main["patches"][0]["changelog_only"]
    assert main["patches"][0]["detail"] == (
        f"only in CHANGELOG.md (merge conflict in {CHANGELOG}); the code applies clean")
    assert main["patches"][2]["detail"] == ("merge conflict in src/lightning/fabric/calc.py; "
                                            "kept its other hunks, rejected: src/lightning/fabric/calc.py")
    assert not main["patches"][2]["changelog_only"]
    # on the tag every patch applies: upstream's tests are compared
    assert tag["test_paths"] == ["tests_fabric/test_calc.py", "tests_fabric/test_state.py"]  # the suite's top level
    assert tag["before"] == "5 passed"
    assert tag["regressions"] == ["tests.tests_fabric.test_calc::test_mul: passed -> failed (assert 7 == 6)"]
    # fails after the series, passes when run again alone: reported, not counted as a regression
    assert tag["flaky"] == ["tests.tests_fabric.test_state::test_no_leftover_state: passed -> failed (assert not True)"]
    assert tag["changed"] == tag["regressions"] + tag["flaky"]  # patch 3's change to sub keeps its test passing
    assert tag["series_tests"] == "1 passed, 1 error"
    assert tag["series_failure_reasons"] == {"fixture 'xpu_count_1' not found": 1}
    # on main patch 3 conflicts in code: the tree is not the series, so its tests say nothing about the series
    assert main["before"] == "5 passed"
    assert main["after"].startswith("not run: 1 patch(es) conflict in code")
    assert main["changed"] == main["regressions"] == []
    assert "2 conflicting patch(es), 1 upstream test regression(s) over 2 ref(s)" in proc.stdout
    assert "patches: 0 clean, 1 3-way, 2 CONFLICT (1 of them only in CHANGELOG.md)" in proc.stdout
    assert "0003-fabric-change-sub.patch  CONFLICT  merge conflict in src/lightning/fabric/calc.py;" in proc.stdout
    # the checkout itself is untouched
    assert git(upstream, "rev-parse", "HEAD") == before
    assert git(upstream, "status", "--porcelain") == ""


def test_a_file_the_sdist_ships_differently_merges_with_the_base_blobs(tmp_path):
    """The sdist's calc.py differs from the tag's (a backport); a patch next to that line needs a 3-way merge,
    which only works with the sdist's file version, which upstream's history lacks."""
    upstream = tmp_path / "upstream"
    init_repo(upstream, {**SRC, "src/lightning/fabric/calc.py": calc()})
    git(upstream, "tag", "1.0.0")
    workspace = tmp_path / "workspace"
    init_repo(workspace, {**SRC, "src/lightning/fabric/calc.py": calc(l16="def div(a, b):  # backported")})
    commit(workspace, "fabric: change mul", {"src/lightning/fabric/calc.py": calc(
        l16="def div(a, b):  # backported", l13="    return a * b + 1")})
    series = make_series(workspace, "HEAD~1", tmp_path / "patches")
    git(workspace, "checkout", "-q", "HEAD~1")
    args = ("--checkout", str(upstream), "--series", str(series), "--ref", "1.0.0", "--no-tests")
    with_base = _replay(*args, "--base-tree", str(workspace))
    assert "0001-fabric-change-mul.patch  3-way" in with_base.stdout, with_base.stdout + with_base.stderr
    (tmp_path / "empty").mkdir()  # a base without the file: nothing to merge with
    without = _replay(*args, "--base-tree", str(tmp_path / "empty"))
    assert "0001-fabric-change-mul.patch  CONFLICT" in without.stdout, without.stdout + without.stderr
    assert _replay(*args, "--base-tree", str(tmp_path / "absent")).returncode == 2


def test_without_a_checkout_it_says_why_it_is_skipped(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "LIGHTNING_UPSTREAM_CHECKOUT"}
    proc = _replay(env=env)
    assert proc.returncode == 0
    assert proc.stdout.startswith("replay check skipped: LIGHTNING_UPSTREAM_CHECKOUT is not set.")


def test_rejects_a_directory_that_is_not_a_git_checkout(tmp_path):
    proc = _replay("--checkout", str(tmp_path), "--no-tests")
    assert proc.returncode == 2
    assert "is not a git checkout" in proc.stderr


def test_default_refs_fall_back_to_the_newest_earlier_release_tag(tmp_path):
    repo = tmp_path / "repo"
    init_repo(repo, {"a": "1\n"})
    for tag in ("2.6.4", "2.6.5", "2.7.0", "2.6.10"):
        git(repo, "tag", tag)
    git(repo, "branch", "master")
    assert default_refs(repo, "2.6.6") == [
        ("2.6.5", "tag 2.6.6 is not in this checkout; using 2.6.5, its newest earlier release tag"), ("master", "")]
    git(repo, "tag", "2.6.6")
    assert default_refs(repo, "2.6.6") == [("2.6.6", ""), ("master", "")]


def test_master_variant_replays_onto_refs_that_contain_its_base(tmp_path):
    """The release series goes onto the tag and the master variant onto master. The release series breaks an upstream
    test that the master variant edits on purpose: reported as such, not as a regression."""
    upstream = tmp_path / "upstream"
    init_repo(upstream, {**SRC, "src/lightning/fabric/calc.py": calc(), "tests/__init__.py": "",
                         "pyproject.toml": "[tool.pytest.ini_options]\naddopts = []\n",
                         "tests/tests_fabric/__init__.py": "", "tests/tests_fabric/test_calc.py": TESTS})
    git(upstream, "tag", "1.0.0")
    commit(upstream, "later upstream work", {"src/lightning/fabric/calc.py": calc(l13="    return a.__mul__(b)")})
    workspace = tmp_path / "workspace"
    init_repo(workspace, {**SRC, "src/lightning/fabric/calc.py": calc()})
    commit(workspace, "fabric: change mul", {"src/lightning/fabric/calc.py": calc(l13="    return a * b + 1")})
    release = make_series(workspace, "HEAD~1", tmp_path / "patches")
    git(workspace, "checkout", "-q", "HEAD~1")
    ported = tmp_path / "ported"
    git(tmp_path, "clone", "-q", str(upstream), str(ported))
    commit(ported, "fabric: change mul", {"src/lightning/fabric/calc.py": calc(l13="    return a.__mul__(b) + 1"),
                                          "tests/tests_fabric/test_calc.py": TESTS.replace("== 6", "== 7")})
    master = make_series(ported, "HEAD~1", tmp_path / "patches-master")
    (master / "base.toml").write_text('[upstream]\nrepository = "https://example.invalid/upstream"\nref = "main"\n'
                                      f'commit = "{git(upstream, "rev-parse", "HEAD").strip()}"\n')
    report = tmp_path / "report.json"
    proc = _replay("--checkout", str(upstream), "--series", str(release), "--master-series", str(master),
                   "--ref", "1.0.0", "--ref", "main", "--workers", "0", "--json", str(report),
                   "--base-tree", str(workspace))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tag, main = json.loads(report.read_text())
    assert tag["series"] == str(release) and main["series"] == str(master)
    assert [p["result"] for p in tag["patches"]] == [p["result"] for p in main["patches"]] == ["clean"]
    assert tag["regressions"] == [] and tag["edited"] == [
        "tests.tests_fabric.test_calc::test_mul: passed -> failed (assert 7 == 6)"]
    assert main["changed"] == [] and main["after"] == "4 passed"
    assert "edited by the master variant: tests.tests_fabric.test_calc::test_mul" in proc.stdout


def test_files_scope_takes_only_the_touched_test_files_and_namesakes(tmp_path):
    from ci.replay_upstream import test_paths
    from lightning_xpu.series import load_series

    upstream, series = _upstream_and_series(tmp_path)
    tree = tmp_path / "tree"
    git(tmp_path, "clone", "-q", str(upstream), str(tree))
    (tree / "tests/tests_fabric/test_neg.py").write_text("")  # the series' test file, as after the series
    # the series' test file and upstream's test of the module it changes, not the rest of the directory
    assert sorted(test_paths(tree, load_series(series), "files")) == ["tests_fabric/test_calc.py",
                                                                      "tests_fabric/test_neg.py"]
    assert sorted(test_paths(tree, load_series(series), "dirs")) == [
        "tests_fabric/test_calc.py", "tests_fabric/test_neg.py", "tests_fabric/test_state.py"]


def test_xpu_cases_of_upstreams_tests_are_told_apart_from_the_series_own():
    from ci.junit import Case
    from ci.replay_upstream import split_xpu_cases

    before = [Case("tests_fabric.test_calc::test_add[cuda]", "skipped"),
              Case("tests_fabric.test_calc::test_sub", "passed")]
    xpu = [Case("tests_fabric.test_calc::test_add[xpu]", "passed"),  # a parameter added to upstream's test
           Case("tests_fabric.test_calc::test_sub", "passed"),
           Case("tests_fabric.test_xpu::test_add_on_xpu", "failed", "boom")]  # the series' own test
    upstream, ours = split_xpu_cases(before, xpu)
    assert [c.id for c in upstream] == ["tests_fabric.test_calc::test_add[xpu]", "tests_fabric.test_calc::test_sub"]
    assert [c.id for c in ours] == ["tests_fabric.test_xpu::test_add_on_xpu"]


def test_a_standalone_xpu_case_of_upstreams_test_is_upstreams_whatever_the_rootdir():
    from ci.junit import Case
    from ci.replay_upstream import split_xpu_cases

    # upstream's pytest runs from the checkout's rootdir, the standalone runner's from tests/
    before = [Case("tests.tests_pytorch.test_gather::test_collection[gpu]", "skipped")]
    standalone = [Case("tests_pytorch.test_gather::test_collection[xpu]", "passed")]
    upstream, ours = split_xpu_cases(before, standalone)
    assert [c.id for c in upstream] == ["tests_pytorch.test_gather::test_collection[xpu]"]
    assert ours == []


def test_xpu_cases_run_in_the_xpu_tier_and_standalone_ones_each_in_a_process(tmp_path, monkeypatch):
    from ci import replay_upstream
    from ci.junit import Case

    runs, standalone = [], []

    def fake_tests(tree, paths, workers, junit, timeout, tier=None):
        runs.append(tier)
        return [Case("t::test_a[xpu]", "passed"), Case("t::test_b[xpu]", "skipped", "Requires: [Standalone execution]")]

    def fake_standalone(dest, suites, args, env, parallel=1):
        standalone.append((dest, env["LIGHTNING_XPU_EMULATOR"], env["RUN_ONLY_XPU_TESTS"]))
        junit = next(a for a in args if a.startswith("--junitxml=")).split("=", 1)[1]
        Path(junit.removesuffix(".xml") + ".standalone-0.xml").write_text(
            '<testsuite><testcase classname="t" name="test_b[xpu]"/><testcase classname="t" name="test_c[ddp-gpu]">'
            '<skipped message="GPUs>=2"/></testcase></testsuite>')
        return 0

    monkeypatch.setattr(replay_upstream, "run_upstream_tests", fake_tests)
    monkeypatch.setattr(replay_upstream, "run_standalone", fake_standalone)
    cases = replay_upstream.run_xpu_cases(tmp_path, ["tests_fabric"], 2, 1, tmp_path / "x.xml", 60)
    assert runs == [{"LIGHTNING_XPU_EMULATOR": "2", "RUN_ONLY_XPU_TESTS": "1"}]
    assert standalone == [(tmp_path / "tests", "2", "1")]
    # the standalone test counts once, with its outcome from its own process; a CUDA case is no XPU case
    assert [(c.id, c.outcome) for c in cases] == [("t::test_a[xpu]", "passed"), ("t::test_b[xpu]", "passed")]


def test_a_test_the_series_parametrises_is_compared_with_its_new_cases_not_reported_missing():
    from ci.junit import Case
    from ci.replay_upstream import compare

    before = [Case("t.test_a::test_x", "skipped"), Case("t.test_a::test_y[16-mixed]", "passed"),
              Case("t.test_a::test_z", "passed")]
    after = [Case("t.test_a::test_x[gpu]", "skipped"), Case("t.test_a::test_x[xpu]", "failed", "no XPU"),
             Case("t.test_a::test_y[cuda-16-mixed]", "failed", "boom")]
    series = mock.Mock(files=())
    changed, regressions, _ = compare(before, after, series)
    # test_x's CUDA case kept its outcome (its xpu case is the series' to report); test_y's broke; test_z is gone
    assert changed == ["t.test_a::test_y[16-mixed]: passed -> failed as test_y[cuda-16-mixed] (boom)",
                       "t.test_a::test_z: passed -> missing"]
    assert [c.id for c in regressions] == ["t.test_a::test_y[cuda-16-mixed]", "t.test_a::test_z"]
