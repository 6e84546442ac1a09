"""workspace and export: round trips are byte-identical and exports deterministic."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest

from lightning_xpu.base import Base
from lightning_xpu.errors import ToolError
from lightning_xpu.series import Series, load_series
from lightning_xpu.workspace import BASE_TAG, create_workspace, export_workspace

from .conftest import PATCHES, git, run_cli, tree_digest


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert mismatch == [] and errors == []


def test_round_trip_is_byte_identical(fake_series: Series, base: Base, tmp_path: Path) -> None:
    repo = create_workspace(fake_series, base, tmp_path / "ws")
    assert git(repo, "rev-list", "--count", f"{BASE_TAG}..HEAD") == "3\n"
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(PATCHES / "base.toml", out)
    export_workspace(repo, out, base)
    _same_files(out, fake_series.directory)


def test_export_twice_is_identical_and_base_commit_is_reproducible(
    fake_series: Series, base: Base, tmp_path: Path
) -> None:
    one = create_workspace(fake_series, base, tmp_path / "one")
    two = create_workspace(fake_series, base, tmp_path / "two")
    assert git(one, "rev-parse", BASE_TAG) == git(two, "rev-parse", BASE_TAG)
    first, second = tmp_path / "e1", tmp_path / "e2"
    export_workspace(one, first, base)
    export_workspace(one, second, base)
    _same_files(first, second)


def test_export_follows_edits_and_drops_stale_patches(fake_series: Series, base: Base, tmp_path: Path) -> None:
    repo = create_workspace(fake_series, base, tmp_path / "ws")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    readme = repo / "src/lightning/pytorch/accelerators/cuda.py"
    readme.write_text(readme.read_text() + "# one more\n")
    git(repo, "commit", "-q", "-a", "-m", "pytorch: another change")
    out = fake_series.directory
    names = export_workspace(repo, out, base)
    assert names[-1] == "0003-pytorch-another-change.patch"
    assert not (out / "0003-fabric-drop-the-changelog-to-exercise-file-removal.patch").exists()
    assert (out / "base.toml").is_file()
    assert [p.name for p in load_series(out).patches] == names


def test_export_replaces_a_series_file_that_lists_missing_patches(
    fake_series: Series, base: Base, tmp_path: Path
) -> None:
    repo = create_workspace(fake_series, base, tmp_path / "ws")
    git(repo, "reset", "-q", "--hard", "HEAD~1")
    out = fake_series.directory
    load_series(out).patches[-1].path.unlink()  # listed, gone, and no longer exported
    names = export_workspace(repo, out, base)
    assert [p.name for p in load_series(out).patches] == names
    assert all((out / name).is_file() for name in names)


def test_dirty_workspace_is_not_exported(fake_series: Series, base: Base, tmp_path: Path) -> None:
    repo = create_workspace(fake_series, base, tmp_path / "ws")
    (repo / "src/lightning/__init__.py").write_text("# edited\n")
    before = tree_digest(fake_series.directory)
    with pytest.raises(ToolError, match="uncommitted changes"):
        export_workspace(repo, fake_series.directory, base)
    assert tree_digest(fake_series.directory) == before


def test_workspace_refuses_existing_directory(fake_series: Series, base: Base, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "keep").write_text("x")
    with pytest.raises(ToolError, match="already exists and is not empty"):
        create_workspace(fake_series, base, tmp_path / "ws")
    assert [p.name for p in (tmp_path / "ws").iterdir()] == ["keep"]


def test_workspace_with_conflicting_series_leaves_nothing(fake_series: Series, base: Base, tmp_path: Path) -> None:
    patch = fake_series.patches[1].path
    lines = patch.read_text().splitlines(keepends=True)
    context = next(i for i, ln in enumerate(lines) if i > 0 and lines[i - 1].startswith("@@ ") and ln.startswith(" "))
    lines[context] = " # context that upstream does not have\n"
    patch.write_text("".join(lines))
    with pytest.raises(ToolError, match="0002-pytorch-mark.* does not apply"):
        create_workspace(load_series(fake_series.directory), base, tmp_path / "ws")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["series"]


def test_export_refuses_a_plain_repository(base: Base, tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    with pytest.raises(ToolError, match="has no tag lightning-xpu/base"):
        export_workspace(tmp_path, tmp_path / "out", base)


def test_cli_workspace_and_export(fake_series: Series, tmp_path: Path) -> None:
    series = str(fake_series.directory)
    proc = run_cli("workspace", str(tmp_path / "ws"), "--series", series)
    assert proc.returncode == 0, proc.stderr
    assert "3 patch commits" in proc.stdout
    before = tree_digest(fake_series.directory)
    proc = run_cli("export", str(tmp_path / "ws"), "--series", series)
    assert proc.returncode == 0, proc.stderr
    assert tree_digest(fake_series.directory) == before
