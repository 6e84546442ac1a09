"""apply: plain source trees, git checkouts, dry runs and atomic failure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lightning_xpu import cli
from lightning_xpu.apply import PatchFailed, apply, apply_to_tree
from lightning_xpu.errors import ToolError
from lightning_xpu.series import Series, load_series

from .conftest import MARKER_FILE, MARKER_SOURCE, git, run_cli, tree_digest

CUDA = "src/lightning/fabric/accelerators/cuda.py"


@pytest.fixture
def sdist_copy(trees: dict[str, Path], tmp_path: Path) -> Path:
    target = tmp_path / "lightning-2.6.6"
    shutil.copytree(trees["lightning"], target, symlinks=True)
    return target


@pytest.fixture
def checkout(sdist_copy: Path) -> Path:
    """A git checkout made from the sdist, standing in for an upstream clone."""
    git(sdist_copy, "init", "-q")
    git(sdist_copy, "add", "-A", "-f")
    git(sdist_copy, "commit", "-q", "-m", "upstream")
    return sdist_copy


def _break_cuda(target: Path) -> None:
    path = target / CUDA
    path.write_text(path.read_text().replace("Device should be CUDA,", "Device must be CUDA,"))


def test_apply_to_unpacked_sdist(fake_series: Series, sdist_copy: Path, fake_workspace: Path) -> None:
    result = apply(fake_series, sdist_copy)
    assert result.kind == "tree" and len(result.applied) == 3
    assert (sdist_copy / MARKER_FILE).read_text() == MARKER_SOURCE
    assert "(fake series)" in (sdist_copy / CUDA).read_text()
    assert not (sdist_copy / "src/lightning/fabric/CHANGELOG.md").exists()
    # The result is exactly the workspace's HEAD tree.
    workspace_files = tree_digest(fake_workspace)
    assert tree_digest(sdist_copy) == workspace_files


def test_check_leaves_tree_untouched(fake_series: Series, sdist_copy: Path) -> None:
    before = tree_digest(sdist_copy)
    result = apply(fake_series, sdist_copy, check=True)
    assert result.checked_only and len(result.applied) == 3
    assert tree_digest(sdist_copy) == before


def test_conflict_leaves_tree_byte_identical_and_names_the_hunk(fake_series: Series, sdist_copy: Path) -> None:
    _break_cuda(sdist_copy)
    before = tree_digest(sdist_copy)
    with pytest.raises(PatchFailed) as err:
        apply(fake_series, sdist_copy)
    message = str(err.value)
    assert message.startswith("patch 0001-fabric-add-a-fake-marker-module.patch does not apply: ")
    assert f"{CUDA}, hunk #1 `@@ -33,7 +33,7 @@" in message
    assert tree_digest(sdist_copy) == before


def test_failure_in_a_later_patch_undoes_the_earlier_ones(fake_series: Series, sdist_copy: Path) -> None:
    # Patch 3 deletes CHANGELOG.md; a changed CHANGELOG makes it fail after patches 1 and 2 applied in the copy.
    changelog = sdist_copy / "src/lightning/fabric/CHANGELOG.md"
    changelog.write_text(changelog.read_text() + "local note\n")
    before = tree_digest(sdist_copy)
    with pytest.raises(PatchFailed, match="patch 0003-fabric-drop-the-changelog"):
        apply(fake_series, sdist_copy)
    assert tree_digest(sdist_copy) == before


def test_corrupt_patch_fails_cleanly(fake_series: Series, sdist_copy: Path) -> None:
    patch = fake_series.patches[1].path
    patch.write_text(patch.read_text().replace("@@ -", "@@ -x", 1))
    before = tree_digest(sdist_copy)
    with pytest.raises(ToolError, match="patch 0002-pytorch-mark.* does not apply"):
        apply(load_series(fake_series.directory), sdist_copy)
    assert tree_digest(sdist_copy) == before


def test_applying_twice_is_refused_without_change(fake_series: Series, sdist_copy: Path) -> None:
    apply(fake_series, sdist_copy)
    after_first = tree_digest(sdist_copy)
    with pytest.raises(PatchFailed, match="already present: was the series applied before"):
        apply(fake_series, sdist_copy)
    assert tree_digest(sdist_copy) == after_first


def test_not_a_lightning_tree(fake_series: Series, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="does not look like a Lightning source tree"):
        apply_to_tree(fake_series, tmp_path)


def test_apply_to_git_checkout_makes_one_commit_per_patch(fake_series: Series, checkout: Path) -> None:
    result = apply(fake_series, checkout)
    assert result.kind == "git"
    subjects = git(checkout, "log", "--format=%s", "-4").splitlines()
    assert subjects == [p.subject for p in reversed(fake_series.patches)] + ["upstream"]
    assert git(checkout, "log", "-1", "--format=%an", "HEAD~2") == "Fake Author\n"
    assert (checkout / MARKER_FILE).read_text() == MARKER_SOURCE
    assert git(checkout, "status", "--porcelain") == ""


def test_git_conflict_restores_checkout(fake_series: Series, checkout: Path) -> None:
    _break_cuda(checkout)
    git(checkout, "commit", "-q", "-a", "-m", "local change")
    head = git(checkout, "rev-parse", "HEAD")
    before = tree_digest(checkout)
    with pytest.raises(PatchFailed) as err:
        apply(fake_series, checkout)
    assert f"{CUDA}, hunk #1" in str(err.value)
    assert git(checkout, "rev-parse", "HEAD") == head
    assert git(checkout, "status", "--porcelain") == ""
    assert not (checkout / ".git" / "rebase-apply").exists()
    assert tree_digest(checkout) == before


def test_git_failure_after_some_patches_resets_to_original_head(fake_series: Series, checkout: Path) -> None:
    changelog = checkout / "src/lightning/fabric/CHANGELOG.md"
    changelog.write_text(changelog.read_text() + "local note\n")
    git(checkout, "commit", "-q", "-a", "-m", "local change")
    head = git(checkout, "rev-parse", "HEAD")
    with pytest.raises(PatchFailed, match="0003-fabric-drop.*after 2 patches applied cleanly"):
        apply(fake_series, checkout)
    assert git(checkout, "rev-parse", "HEAD") == head
    assert git(checkout, "status", "--porcelain") == ""


def test_dirty_checkout_is_refused(fake_series: Series, checkout: Path) -> None:
    _break_cuda(checkout)
    with pytest.raises(ToolError, match="has uncommitted changes"):
        apply(fake_series, checkout)
    assert git(checkout, "rev-list", "--count", "HEAD") == "1\n"


def test_cli_apply_and_check(fake_series: Series, checkout: Path) -> None:
    series = str(fake_series.directory)
    proc = run_cli("apply", "--check", "--series", series)
    assert proc.returncode == 0, proc.stderr
    assert "All 3 patches apply to the pinned base lightning 2.6.6." in proc.stdout
    proc = run_cli("apply", str(checkout), "--check", "--series", series)
    assert proc.returncode == 0 and git(checkout, "rev-list", "--count", "HEAD") == "1\n"
    proc = run_cli("apply", str(checkout), "--series", series)
    assert proc.returncode == 0, proc.stderr
    assert "Applied 3 patches as commits" in proc.stdout
    # git am -3 recognises changes that are already there and makes no commit; the report says so.
    head = git(checkout, "rev-parse", "HEAD")
    proc = run_cli("apply", str(checkout), "--series", series)
    assert proc.returncode == 0, proc.stderr
    assert "Applied 0 patches as commits" in proc.stdout and "Skipped 3 patches" in proc.stdout
    assert git(checkout, "rev-parse", "HEAD") == head
    git(checkout, "reset", "-q", "--hard", "HEAD~3")
    _break_cuda(checkout)
    git(checkout, "commit", "-q", "-a", "-m", "local change")
    proc = run_cli("apply", str(checkout), "--series", series)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "does not apply" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_without_git_is_a_clear_error(fake_series: Series, sdist_copy: Path, tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    before = tree_digest(sdist_copy)
    proc = run_cli("apply", str(sdist_copy), "--series", str(fake_series.directory), env={"PATH": str(empty_bin)})
    assert proc.returncode == 1
    assert proc.stderr == (
        "lightning-xpu: error: git is required but was not found on PATH; install git (2.28 or newer) and retry\n"
    )
    assert tree_digest(sdist_copy) == before


def _master_variant(release: Series, commit: str, patches: int) -> Path:
    """A master variant inside the release series' directory: its first ``patches`` patches, made against ``commit``."""
    master = release.directory / "master"
    master.mkdir()
    for patch in release.patches[:patches]:
        shutil.copy(patch.path, master)
    (master / "series").write_text("".join(f"{p.name}\n" for p in release.patches[:patches]))
    (master / "base.toml").write_text(f'[upstream]\nrepository = "https://example.invalid/upstream"\nref = "master"\n'
                                      f'commit = "{commit}"\n')
    return master


def test_a_checkout_that_has_the_master_variants_base_gets_the_master_variant(
        fake_series: Series, checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    head = git(checkout, "rev-parse", "HEAD").strip()
    master = _master_variant(fake_series, head, 2)
    monkeypatch.setattr("lightning_xpu.series.default_series_dir", lambda: fake_series.directory)
    assert cli.main(["apply", str(checkout)]) == 0
    out = capsys.readouterr().out
    assert f"has upstream master at {head[:12]} in its history: applying the master variant {master}." in out
    assert "Applied 2 patches as commits" in out
    git(checkout, "reset", "-q", "--hard", head)
    assert cli.main(["apply", str(checkout), "--series", str(fake_series.directory)]) == 0  # named: used as named
    assert "Applied 3 patches as commits" in capsys.readouterr().out


def test_a_release_series_that_does_not_apply_names_the_master_variant(
        fake_series: Series, checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    _break_cuda(checkout)
    git(checkout, "commit", "-q", "-a", "-m", "upstream moved on")
    master = _master_variant(fake_series, "0" * 40, 3)  # a base commit this checkout does not have
    monkeypatch.setattr("lightning_xpu.series.default_series_dir", lambda: fake_series.directory)
    assert cli.main(["apply", str(checkout)]) == 1
    err = capsys.readouterr().err
    assert "does not apply" in err and err.count("\n") == 1
    assert err.rstrip().endswith("if TARGET is upstream's master branch, apply the master variant (against master "
                                 f"at 000000000000): add --series {master}")
    assert cli.main(["apply", str(checkout), "--series", str(master)]) == 1  # the master variant's own failure
    assert "--series" not in capsys.readouterr().err
