"""The master variant's tooling: upstream-based series, workspaces from a checkout, port, CHANGELOG merge."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lightning_xpu.base import load_base
from lightning_xpu.changelog_merge import Unmergeable, merge
from lightning_xpu.changelog_merge import main as merge_driver
from lightning_xpu.errors import ToolError
from lightning_xpu.port import port
from lightning_xpu.series import Series, load_series
from lightning_xpu.upstream import UpstreamBase, load_upstream_base, resolve_checkout
from lightning_xpu.workspace import BASE_TAG, create_upstream_workspace, export_workspace

from .conftest import PATCHES, git, run_cli

CHANGELOG_PATH = "src/lightning/fabric/CHANGELOG.md"
MODULE = "src/lightning/fabric/accelerators/fake.py"
SDIST_CHANGELOG = """# Changelog

## [unreleased] - YYYY-MM-DD

### Added

-

### Changed

-

---

## [2.6.6] - 2026-09-10
"""
MODULE_SOURCE = "".join(f"LINE_{i} = {i}\n" for i in range(30))


def _write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A fake released tree, an upstream repo that moved on from it, and a one-patch release series against it."""
    sdist = tmp_path / "sdist"
    _write(sdist, CHANGELOG_PATH, SDIST_CHANGELOG)
    _write(sdist, MODULE, MODULE_SOURCE)

    upstream = tmp_path / "upstream"
    shutil.copytree(sdist, upstream)
    git(upstream, "init", "-q", "-b", "master")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "release")
    text = SDIST_CHANGELOG.replace("### Added\n\n-\n", "### Added\n\n- Added upstream's feature ([#1](x))\n\n"
                                   "- Added upstream's other feature ([#2](x))\n")
    _write(upstream, CHANGELOG_PATH, text)
    _write(upstream, MODULE, MODULE_SOURCE.replace("LINE_12 = 12", "LINE_12 = 12  # upstream moved on"))
    git(upstream, "commit", "-q", "-a", "-m", "upstream: a later change")

    release = tmp_path / "release-ws"
    shutil.copytree(sdist, release)
    git(release, "init", "-q", "-b", "main")
    git(release, "add", "-A")
    git(release, "commit", "-q", "-m", "base")
    git(release, "tag", BASE_TAG)
    _write(release, MODULE, MODULE_SOURCE.replace("LINE_15 = 15", "LINE_15 = 'xpu'"))
    _write(release, CHANGELOG_PATH, SDIST_CHANGELOG.replace("### Added\n\n-\n", "### Added\n\n- Added xpu\n"))
    git(release, "commit", "-q", "-a", "-m", "fabric: add xpu")
    release_series = tmp_path / "patches"
    release_series.mkdir()
    shutil.copy(PATCHES / "base.toml", release_series)
    export_workspace(release, release_series, load_base(PATCHES))

    master_series = tmp_path / "patches-master"
    master_series.mkdir()
    commit = git(upstream, "rev-parse", "HEAD").strip()
    (master_series / "base.toml").write_text(
        f'[upstream]\nrepository = "https://example.invalid/upstream"\nref = "master"\ncommit = "{commit}"\n')
    (master_series / "series").write_text("# empty\n")
    return {"sdist": sdist, "upstream": upstream, "release_ws": release, "release": release_series,
            "master": master_series}


def test_upstream_base_record_and_clear_errors(world: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_upstream_base(world["master"])
    assert base.ref == "master" and len(base.commit) == 40
    with pytest.raises(ToolError, match="upstream git commit"):
        load_base(world["master"])
    monkeypatch.delenv("LIGHTNING_UPSTREAM_CHECKOUT", raising=False)
    with pytest.raises(ToolError, match="--upstream CHECKOUT"):
        resolve_checkout(None, base)
    with pytest.raises(ToolError, match="does not have commit"):
        resolve_checkout(world["release_ws"], base)
    monkeypatch.setenv("LIGHTNING_UPSTREAM_CHECKOUT", str(world["upstream"]))
    assert resolve_checkout(None, base) == world["upstream"].resolve()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "base.toml").write_text('[upstream]\nrepository = "x"\nref = "master"\ncommit = "abc"\n')
    with pytest.raises(ToolError, match="full 40-digit sha"):
        load_upstream_base(bad)


def test_port_workspace_export_round_trip(world: dict[str, Path], tmp_path: Path) -> None:
    master = load_series(world["master"])
    base = load_upstream_base(world["master"])
    ws = create_upstream_workspace(master, base, world["upstream"], tmp_path / "ws")
    assert git(ws, "rev-parse", BASE_TAG).strip() == base.commit

    result = port(load_series(world["release"]), ws, world["sdist"])
    assert result.applied == [("0001-fabric-add-xpu.patch", "3-way")] and result.conflict is None
    assert "LINE_15 = 'xpu'" in (ws / MODULE).read_text()
    assert "# upstream moved on" in (ws / MODULE).read_text()
    # the entry goes to the end of its section, spaced like upstream's
    assert "- Added upstream's other feature ([#2](x))\n\n- Added xpu\n\n### Changed\n\n-\n" in (
        ws / CHANGELOG_PATH).read_text()
    assert port(load_series(world["release"]), ws, world["sdist"]).applied == []  # nothing left to port

    names = export_workspace(ws, world["master"], base)
    assert names == ["0001-fabric-add-xpu.patch"]
    header = (world["master"] / "series").read_text()
    assert base.commit in header and "sdist" not in header
    again = create_upstream_workspace(load_series(world["master"]), base, world["upstream"], tmp_path / "again")
    assert (again / MODULE).read_text() == (ws / MODULE).read_text()
    second = tmp_path / "second"
    second.mkdir()
    export_workspace(again, second, base)
    for name in [*names, "series"]:
        assert (second / name).read_bytes() == (world["master"] / name).read_bytes()


def test_port_appends_only_new_patches_and_stops_at_a_real_conflict(world: dict[str, Path], tmp_path: Path) -> None:
    base = load_upstream_base(world["master"])
    ws = create_upstream_workspace(load_series(world["master"]), base, world["upstream"], tmp_path / "ws")
    port(load_series(world["release"]), ws, world["sdist"])
    # the release series grows by a patch that changes the line upstream changed too
    release = world["release_ws"]
    _write(release, MODULE, (release / MODULE).read_text().replace("LINE_12 = 12", "LINE_12 = 'xpu'"))
    git(release, "commit", "-q", "-a", "-m", "fabric: change line twelve")
    export_workspace(release, world["release"], load_base(PATCHES))
    result = port(load_series(world["release"]), ws, world["sdist"])
    assert result.applied == [] and result.conflict == "0002-fabric-change-line-twelve.patch"
    assert result.conflicted_files == [MODULE]
    assert (ws / ".git" / "rebase-apply").is_dir()  # the git am session is left open for a human
    with pytest.raises(ToolError, match="middle of a git am"):
        port(load_series(world["release"]), ws, world["sdist"])


def test_workspace_leaves_out_files_whose_contents_the_checkout_lacks(world: dict[str, Path], tmp_path: Path) -> None:
    upstream = world["upstream"]
    _write(upstream, "docs/big.gif", "GIF89a not really\n")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "docs: a large image")
    blob = git(upstream, "rev-parse", "HEAD:docs/big.gif").strip()
    (upstream / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # a mirror without its large blobs
    commit = git(upstream, "rev-parse", "HEAD").strip()
    base = UpstreamBase("https://example.invalid/upstream", "master", commit)
    ws = create_upstream_workspace(load_series(world["master"]), base, upstream, tmp_path / "ws")
    assert not (ws / "docs/big.gif").exists() and (ws / MODULE).is_file()
    assert "docs/big.gif" in git(ws, "log", "-1", "--format=%B", BASE_TAG)
    assert git(ws, "rev-parse", f"{BASE_TAG}~1").strip() == commit


def test_cli_workspace_and_check_for_an_upstream_series(world: dict[str, Path], tmp_path: Path) -> None:
    env = {"LIGHTNING_UPSTREAM_CHECKOUT": ""}
    proc = run_cli("workspace", str(tmp_path / "ws"), "--series", str(world["master"]), env=env)
    assert proc.returncode == 1 and "--upstream CHECKOUT" in proc.stderr
    proc = run_cli("workspace", str(tmp_path / "ws"), "--series", str(world["master"]), "--upstream",
                   str(world["upstream"]), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "upstream master" in proc.stdout
    proc = run_cli("apply", "--check", "--series", str(world["master"]), "--upstream", str(world["upstream"]))
    assert proc.returncode == 0 and "apply to upstream master" in proc.stdout, proc.stderr
    for args in (["build"], ["apply", "--installed"]):
        proc = run_cli(*args, "--series", str(world["master"]))
        assert proc.returncode == 1 and "needs the release series" in proc.stderr
    proc = run_cli("workspace", str(tmp_path / "other"), "--upstream", str(world["upstream"]))
    assert proc.returncode == 1 and "pins the released sdists" in proc.stderr


def test_changelog_merge_appends_entries_and_refuses_rewrites(tmp_path: Path) -> None:
    ours = SDIST_CHANGELOG.replace("### Changed\n\n-\n", "### Changed\n\n- Changed a ([#3](x))\n\n- Changed b\n")
    theirs = SDIST_CHANGELOG.replace("### Added\n\n-\n", "### Added\n\n- Added xpu\n").replace(
        "### Changed\n\n-\n", "### Changed\n\n- Changed c\n")
    merged = merge(SDIST_CHANGELOG, ours, theirs)
    assert "### Added\n\n- Added xpu\n\n### Changed\n\n- Changed a ([#3](x))\n\n- Changed b\n\n- Changed c\n" in merged
    with pytest.raises(Unmergeable, match="removes or rewrites"):
        merge(SDIST_CHANGELOG, ours, SDIST_CHANGELOG.replace("## [2.6.6] - 2026-09-10", "## [2.6.6] - someday"))
    paths = [tmp_path / n for n in ("base", "ours", "theirs")]
    for path, text in zip(paths, (SDIST_CHANGELOG, ours, SDIST_CHANGELOG.replace("# Changelog", "# Changes")),
                          strict=True):
        path.write_text(text)
    assert merge_driver([str(p) for p in paths]) == 0  # the conflict-free part: git merge-file handles it
    paths[1].write_text(ours.replace("2026-09-10", "2026-09-11"))
    paths[2].write_text(SDIST_CHANGELOG.replace("2026-09-10", "2026-09-12"))
    assert merge_driver([str(p) for p in paths]) == 1
    assert "<<<<<<< ours" in paths[1].read_text()


NAMESAKE = "tests/tests_fabric/test_fake.py"
NAMESAKE_SOURCE = '''import pytest

from lightning.fabric.accelerators.fake import LINE_1


def test_line_1():
    assert LINE_1 == 1
'''
XPU_TEST = "tests/tests_fabric/test_fake_xpu.py"
XPU_SOURCE = '''"""Tests of the fake module on xpu."""

import pytest

from lightning.fabric.accelerators.fake import LINE_15


def test_line_15():
    assert LINE_15 == "xpu"
'''


def test_plan_and_fold_text(tmp_path: Path) -> None:
    from lightning_xpu.testmerge import fold_tree, namesake_of, plan, unfold_text

    _write(tmp_path, NAMESAKE, NAMESAKE_SOURCE)
    _write(tmp_path, XPU_TEST, XPU_SOURCE)
    _write(tmp_path, "tests/tests_fabric/test_alone_xpu.py", "def test_x():\n    pass\n")
    assert plan(tmp_path, "tests/tests_fabric/test_alone_xpu.py").reason == "no upstream namesake"
    autouse = XPU_SOURCE + "\n\n@pytest.fixture(autouse=True)\ndef everywhere():\n    pass\n"
    assert "module-wide" in plan(tmp_path, XPU_TEST, autouse).reason  # judged on the file's final version
    assert "test_line_1" in plan(tmp_path, XPU_TEST, XPU_SOURCE + "\n\ndef test_line_1():\n    pass\n").reason
    assert plan(tmp_path, XPU_TEST).folds
    assert namesake_of("tests/tests_fabric/test_fake_side_stream.py", tmp_path) == NAMESAKE  # the longest prefix
    assert namesake_of("tests/tests_fabric/test_other_xpu.py", tmp_path) == ""

    folds = fold_tree(tmp_path, [XPU_TEST, "tests/tests_fabric/test_alone_xpu.py"])
    assert [f.folds for f in folds] == [True, False]
    folded = (tmp_path / NAMESAKE).read_text()
    assert not (tmp_path / XPU_TEST).exists() and (tmp_path / "tests/tests_fabric/test_alone_xpu.py").exists()
    # one sorted import block, upstream's code unchanged, the tests appended
    assert folded == ('import pytest\n\nfrom lightning.fabric.accelerators.fake import LINE_1, LINE_15\n\n\n'
                      'def test_line_1():\n    assert LINE_1 == 1\n\n\n'
                      'def test_line_15():\n    assert LINE_15 == "xpu"\n')
    assert unfold_text(folded, XPU_SOURCE).startswith(folded.split("def test_line_15")[0].rstrip("\n"))
    assert "test_line_15" not in unfold_text(folded, XPU_SOURCE)


def test_port_folds_test_files_into_their_namesakes_and_refolds_later_changes(world: dict[str, Path],
                                                                            tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    upstream, release = world["upstream"], world["release_ws"]
    _write(upstream, NAMESAKE, NAMESAKE_SOURCE)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "upstream: tests")
    _write(release, XPU_TEST, XPU_SOURCE)
    git(release, "add", "-A")
    git(release, "commit", "-q", "-m", "fabric: test xpu")
    _write(release, XPU_TEST, XPU_SOURCE.replace('== "xpu"', '!= "cuda"'))
    git(release, "commit", "-q", "-a", "-m", "fabric: test xpu differently")
    export_workspace(release, world["release"], load_base(PATCHES))
    base = UpstreamBase("https://example.invalid/upstream", "master", git(upstream, "rev-parse", "HEAD").strip())
    ws = create_upstream_workspace(load_series(world["master"]), base, upstream, tmp_path / "ws")

    series = load_series(world["release"])
    first = Series(series.directory, series.patches[:2])
    assert [how for _, how in port(first, ws, world["sdist"]).applied] == ["3-way", "clean"]
    assert not (ws / XPU_TEST).exists() and 'assert LINE_15 == "xpu"' in (ws / NAMESAKE).read_text()
    assert git(ws, "show", "--stat", "--format=", "HEAD").count("|") == 1  # the fold is part of the patch's commit
    # the release series grows: the later change to the folded file lands in the namesake, in one commit, also where
    # git has no identity to commit the temporary unfold with (a fresh CI machine)
    for var, value in {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_COUNT": "1",
                       "GIT_CONFIG_KEY_0": "user.useConfigOnly", "GIT_CONFIG_VALUE_0": "true"}.items():
        monkeypatch.setenv(var, value)
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    assert port(series, ws, world["sdist"]).applied == [("0003-fabric-test-xpu-differently.patch", "clean")]
    text = (ws / NAMESAKE).read_text()
    assert 'assert LINE_15 != "cuda"' in text and "== \"xpu\"" not in text and text.count("def test_line_15") == 1
    assert not (ws / XPU_TEST).exists()
    assert git(ws, "log", "-1", "--format=%s") == "fabric: test xpu differently\n"
    assert git(ws, "show", "--format=", "--name-only", "HEAD").split() == [NAMESAKE]


def test_port_carries_an_earlier_master_variants_edits_of_upstreams_files(world: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    upstream = world["upstream"]
    _write(upstream, NAMESAKE, NAMESAKE_SOURCE)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "upstream: tests")
    base = UpstreamBase("https://example.invalid/upstream", "master", git(upstream, "rev-parse", "HEAD").strip())
    ws = create_upstream_workspace(load_series(world["master"]), base, upstream, tmp_path / "ws")
    port(load_series(world["release"]), ws, world["sdist"])
    # the master variant also edits an upstream test, in the same patch
    _write(ws, NAMESAKE, NAMESAKE_SOURCE + "\n\ndef test_upstream_edit():\n    pass\n")
    _write(ws, MODULE, (ws / MODULE).read_text() + "# only on master\n")  # and the release patch's file differently
    git(ws, "commit", "-q", "-a", "--amend", "--no-edit")
    earlier = tmp_path / "earlier-master"
    earlier.mkdir()
    shutil.copy(world["master"] / "base.toml", earlier)
    export_workspace(ws, earlier, base)
    # re-port from scratch (as after a restructured release series): the edit comes along
    git(ws, "reset", "-q", "--hard", BASE_TAG)
    result = port(load_series(world["release"]), ws, world["sdist"], load_series(earlier))
    assert result.carried == [("0001-fabric-add-xpu.patch", [NAMESAKE])]
    assert result.check == [("0001-fabric-add-xpu.patch", [MODULE])]
    assert "test_upstream_edit" in (ws / NAMESAKE).read_text()
    assert git(ws, "rev-list", "--count", f"{BASE_TAG}..HEAD") == "1\n"


def test_after_a_resolved_conflict_port_folds_the_patchs_test_file(world: dict[str, Path], tmp_path: Path) -> None:
    upstream, release = world["upstream"], world["release_ws"]
    _write(upstream, NAMESAKE, NAMESAKE_SOURCE)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "upstream: tests")
    # the release patch changes the line upstream changed (a real conflict) and adds a test file to fold
    _write(release, MODULE, (release / MODULE).read_text().replace("LINE_12 = 12", "LINE_12 = 'xpu'"))
    _write(release, XPU_TEST, XPU_SOURCE)
    git(release, "add", "-A")
    git(release, "commit", "-q", "-m", "fabric: change line twelve")
    export_workspace(release, world["release"], load_base(PATCHES))
    base = UpstreamBase("https://example.invalid/upstream", "master", git(upstream, "rev-parse", "HEAD").strip())
    ws = create_upstream_workspace(load_series(world["master"]), base, upstream, tmp_path / "ws")
    result = port(load_series(world["release"]), ws, world["sdist"])
    assert result.conflict == "0002-fabric-change-line-twelve.patch"
    _write(ws, MODULE, (ws / MODULE).read_text().split("<<<<<<<")[0] + MODULE_SOURCE.split("\n", 12)[12].replace(
        "LINE_12 = 12", "LINE_12 = 'xpu'  # upstream moved on"))
    git(ws, "add", "-A")
    git(ws, "-c", "core.editor=true", "am", "--continue")
    assert (ws / XPU_TEST).exists()
    result = port(load_series(world["release"]), ws, world["sdist"])
    assert result.applied == [("0002-fabric-change-line-twelve.patch", "resolved")]
    assert not (ws / XPU_TEST).exists() and "def test_line_15" in (ws / NAMESAKE).read_text()
    assert git(ws, "log", "-1", "--format=%s") == "fabric: change line twelve\n"
    assert port(load_series(world["release"]), ws, world["sdist"]).applied == []


def test_fold_leaves_out_imports_of_names_the_namesake_already_binds() -> None:
    from lightning_xpu.testmerge import fold_text

    namesake = "from lightning.fabric.accelerators import CPUAccelerator\n\n\ndef test_a():\n    pass\n"
    test_file = ("from lightning.fabric.accelerators.cpu import CPUAccelerator, _parse_cpu_cores\n\n\n"
                 "def test_b():\n    assert CPUAccelerator and _parse_cpu_cores\n")
    folded = fold_text(namesake, test_file)
    assert "from lightning.fabric.accelerators.cpu import _parse_cpu_cores\n" in folded
    assert folded.count("CPUAccelerator\n") == 1 and "def test_b" in folded
