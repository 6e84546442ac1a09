"""Editable workspaces: a git repo with the base as one commit and each patch as a commit; export back to patches/.

Export is deterministic: git runs without user or system configuration, patches carry no commit ids
(``--zero-commit``), no signature, no ``[PATCH n/m]`` numbering and full blob ids, so exporting an unchanged
workspace always yields byte-identical files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lightning_xpu._git import BASE_IDENT, run_git
from lightning_xpu.base import LIGHTNING, Base, unpacked_sdist
from lightning_xpu.errors import ToolError
from lightning_xpu.series import SERIES_FILE, Series, read_series_names
from lightning_xpu.upstream import UpstreamBase, checkout_commit

BASE_TAG = "lightning-xpu/base"
SERIES_HEADER = """\
# Quilt series for lightning-xpu: one patch file name per line, applied in order with `patch -p1`
# (or `git am`) onto {onto}; see {record} for the pinned base.
# Regenerate this file and the patches with `lightning-xpu export WORKSPACE`; do not edit them by hand.
"""
_COMMITTER = {k: BASE_IDENT[k] for k in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")}
FORMAT_PATCH_ARGS = (
    "format-patch", "--zero-commit", "--no-signature", "--full-index", "--no-numbered", "--no-renames",
    "--no-notes", "--no-thread", "--no-cover-letter", "--no-base", "--diff-algorithm=myers", "--stat=72",
    "--start-number=1", "--quiet",
)


def create_workspace(series: Series, base: Base, directory: Path, cache: Path | None = None) -> Path:
    """Create a git workspace at ``directory``: the lightning sdist as the base commit, then one commit per patch."""
    sdist = unpacked_sdist(base.sdist(LIGHTNING), base.version, cache)

    def make_base(repo: Path) -> None:
        shutil.copytree(sdist, repo, symlinks=True)
        run_git(["init", "--quiet", "--initial-branch=main"], repo)
        run_git(["add", "--all", "--force", "."], repo)
        message = f"Import lightning {base.version} sdist\n\nsha256 {base.sdist(LIGHTNING).sha256}\n"
        run_git(["commit", "--quiet", "--no-verify", "-m", message], repo, env=BASE_IDENT, isolate_config=True)

    return _build(series, directory, make_base)


def create_upstream_workspace(series: Series, base: UpstreamBase, checkout: Path, directory: Path) -> Path:
    """Create a git workspace at ``directory`` from an upstream checkout: the base commit, then one commit per patch.

    The base commit is upstream's own (tagged ``lightning-xpu/base``), unless the checkout lacks the contents of some
    files; those are then left out in one extra commit, which becomes the tagged base.
    """

    def make_base(repo: Path) -> None:
        run_git(["clone", "--quiet", "--no-checkout", str(checkout), str(repo)], repo.parent)
        checkout_commit(repo, base.commit, BASE_IDENT)

    return _build(series, directory, make_base)


def _build(series: Series, directory: Path, make_base: Callable[[Path], None]) -> Path:
    """Make the base commit with ``make_base``, tag it and commit each patch; build next to ``directory``, then move.

    The repository is built in a temporary sibling directory, so a patch that fails to apply leaves nothing behind.
    """
    directory = Path(directory).resolve()
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ToolError(f"{directory} already exists and is not empty; choose a new directory")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        repo = tmp / "repo"
        make_base(repo)
        for key, value in (("core.autocrlf", "false"), ("core.fileMode", "true"), ("am.threeWay", "false")):
            run_git(["config", key, value], repo)
        run_git(["tag", BASE_TAG], repo)
        for patch in series.patches:
            proc = run_git(["am", "--quiet", "--committer-date-is-author-date", str(patch.path)], repo,
                           env=_COMMITTER, isolate_config=True, check=False)
            if proc.returncode != 0:
                from lightning_xpu.apply import describe_failure

                raise ToolError(describe_failure(patch, proc.stderr + proc.stdout) + "; no workspace was created")
        if directory.exists():
            directory.rmdir()
        os.rename(repo, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _base_commit(repo: Path) -> str:
    proc = run_git(["rev-parse", "--verify", "--quiet", f"refs/tags/{BASE_TAG}^{{commit}}"], repo, check=False)
    if proc.returncode != 0:
        raise ToolError(f"{repo} has no tag {BASE_TAG}; it was not made by `lightning-xpu workspace`")
    return proc.stdout.strip()


def series_header(base: Base | UpstreamBase) -> str:
    """The comment block at the top of an exported ``series`` file."""
    if isinstance(base, UpstreamBase):
        return SERIES_HEADER.format(onto=f"{base.repository}\n# at {base.ref} {base.commit}",
                                    record="base.toml in this directory")
    return SERIES_HEADER.format(onto=f"the unpacked lightning=={base.version} sdist", record="patches/base.toml")


def export_workspace(repo: Path, output: Path, base: Base | UpstreamBase) -> list[str]:
    """Regenerate ``output``'s ``NNNN-*.patch`` files and ``series`` from the commits after the base tag.

    Returns the patch names in order. Other files in ``output`` (``base.toml``) are left alone; patch files
    no longer in the series are removed.
    """
    repo = Path(repo).resolve()
    if not (repo / ".git").exists():
        raise ToolError(f"{repo} is not a git repository")
    base_commit = _base_commit(repo)
    if run_git(["status", "--porcelain", "--untracked-files=no"], repo).stdout.strip():
        raise ToolError(f"{repo} has uncommitted changes; commit them (one commit per patch) before exporting")
    if run_git(["rev-list", "--merges", f"{base_commit}..HEAD"], repo).stdout.strip():
        raise ToolError(f"{repo} has merge commits after the base; rebase to a linear history before exporting")
    if run_git(["merge-base", "--is-ancestor", base_commit, "HEAD"], repo, check=False).returncode != 0:
        raise ToolError(f"HEAD of {repo} does not descend from the base commit {base_commit[:12]}")
    output = Path(output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output, prefix=".export-") as tmp:
        run_git([*FORMAT_PATCH_ARGS, "-o", tmp, f"{base_commit}..HEAD"], repo, isolate_config=True)
        names = sorted(p.name for p in Path(tmp).glob("*.patch"))
        (Path(tmp) / SERIES_FILE).write_text(
            series_header(base) + "".join(f"{n}\n" for n in names), encoding="utf-8"
        )
        stale = set(_patch_files(output)) - set(names)
        for name in names:
            os.replace(Path(tmp) / name, output / name)
        os.replace(Path(tmp) / SERIES_FILE, output / SERIES_FILE)
        for name in stale:
            (output / name).unlink(missing_ok=True)  # a listed patch may already be gone
    return names


def _patch_files(directory: Path) -> list[str]:
    """Patch files in ``directory`` that an export owns: the listed ones and any ``NNNN-*.patch``."""
    listed = read_series_names(directory) if (directory / SERIES_FILE).is_file() else []
    numbered = [p.name for p in directory.glob("[0-9][0-9][0-9][0-9]-*.patch")]
    return sorted(set(listed) | set(numbered))
