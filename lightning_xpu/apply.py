"""Apply the series to a plain source tree (an unpacked sdist) or to an upstream git checkout, atomically.

A release series kept with its master variant (``patches/master``) hands a git checkout whose history has the
master variant's base commit to the master variant (``master_variant_for``); where the release series does not apply,
the error says to use the master variant by name.

Plain tree: the files the series touches are copied into a temporary directory, every patch is applied
there with ``git apply``, and only when all of them applied are the results moved into the target, one
``os.replace`` per file. Git checkout: ``git am -3``; on failure ``git am --abort`` and a hard reset to
the original commit. Either way a failure leaves the target as it was and names patch, file and hunk.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu._git import clean_env, git_executable, is_git_toplevel, run_git
from lightning_xpu.errors import ToolError
from lightning_xpu.series import Patch, Series
from lightning_xpu.upstream import is_upstream_series, load_upstream_base

MASTER_VARIANT = "master"  # the master variant's directory inside the release series' directory

_FAILED_AT = re.compile(r"^error: patch failed: (.+):(\d+)$")
_ERROR = re.compile(r"^error: (.+)$")
_CONFLICT = re.compile(r"^CONFLICT \([^)]*\): Merge conflict in (.+)$")


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did: the target, its kind (``tree`` or ``git``) and the patches applied (or checked)."""

    target: Path
    kind: str
    applied: tuple[str, ...]
    checked_only: bool
    already_present: tuple[str, ...] = ()


class PatchFailed(ToolError):
    """A patch did not apply; the message names the patch, the file and the hunk."""


def describe_failure(patch: Patch, output: str) -> str:
    """Turn git apply / git am output into one sentence naming patch, file and hunk."""
    lines = output.splitlines()
    for line in lines:
        if m := _FAILED_AT.match(line.strip()):
            path, start = m.group(1), int(m.group(2))
            hunk = patch.find_hunk(path, start)
            where = f"hunk #{hunk.index} `{hunk.header}`" if hunk else f"the hunk at line {start}"
            conflict = any(_CONFLICT.match(ln.strip()) for ln in lines)
            tail = " (3-way merge also conflicted)" if conflict else ""
            return f"patch {patch.name} does not apply: {path}, {where} does not match{tail}"
    for line in lines:
        if m := _CONFLICT.match(line.strip()):
            return f"patch {patch.name} does not apply: merge conflict in {m.group(1)}"
    for line in lines:
        if m := _ERROR.match(line.strip()):
            return f"patch {patch.name} does not apply: {m.group(1)}"
    last = lines[-1].strip() if lines else "git gave no reason"
    return f"patch {patch.name} does not apply: {last}"


def apply_to_tree(series: Series, target: Path, *, check: bool = False) -> ApplyResult:
    """Apply the series to a plain source tree; with ``check`` only verify that it would apply."""
    target = _existing_dir(target)
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-apply-") as tmp:
        work = Path(tmp) / "tree"
        work.mkdir()
        touched = series.files
        for rel in touched:
            src = target / rel
            if src.is_file() or src.is_symlink():
                dst = work / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst, follow_symlinks=False)
        for patch in series.patches:
            # The ceiling stops git from treating an enclosing repository as the one to patch.
            proc = run_git(
                ["apply", "--verbose", "--whitespace=nowarn", str(patch.path)],
                work,
                env={"GIT_CEILING_DIRECTORIES": str(Path(tmp))},
                check=False,
            )
            if proc.returncode != 0:
                message = describe_failure(patch, proc.stderr + proc.stdout)
                reverse = run_git(["apply", "--reverse", "--check", str(patch.path)], work,
                                  env={"GIT_CEILING_DIRECTORIES": str(Path(tmp))}, check=False)
                if reverse.returncode == 0:
                    message += " (its changes are already present: was the series applied before?)"
                raise PatchFailed(f"{message}; {target} is unchanged")
        if not check:
            _move_results(work, target, touched)
    return ApplyResult(target, "tree", tuple(p.name for p in series.patches), check)


def _move_results(work: Path, target: Path, touched: tuple[str, ...]) -> None:
    """Copy patched files next to their targets first, then swap each into place."""
    staged: list[tuple[Path, Path]] = []
    removed: list[Path] = []
    try:
        for rel in touched:
            new, old = work / rel, target / rel
            if new.exists() or new.is_symlink():
                old.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp_name = tempfile.mkstemp(dir=old.parent, prefix=f".{old.name}.")
                os.close(fd)
                shutil.copy2(new, tmp_name, follow_symlinks=False)
                staged.append((Path(tmp_name), old))
            elif old.exists() or old.is_symlink():
                removed.append(old)
    except OSError:
        for tmp_path, _ in staged:
            tmp_path.unlink(missing_ok=True)
        raise
    for tmp_path, old in staged:
        os.replace(tmp_path, old)
    for old in removed:
        old.unlink()
        _prune_empty_dirs(old.parent, target)


def _prune_empty_dirs(path: Path, stop: Path) -> None:
    while path != stop and path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        path = path.parent


def apply_to_git(series: Series, target: Path, *, check: bool = False) -> ApplyResult:
    """Apply the series to a git checkout as commits with ``git am -3``; with ``check`` only verify it."""
    target = _existing_dir(target)
    status = run_git(["status", "--porcelain", "--untracked-files=no"], target).stdout
    if status.strip():
        raise ToolError(f"{target} has uncommitted changes; commit or stash them before applying the series")
    git_dir = Path(run_git(["rev-parse", "--absolute-git-dir"], target).stdout.strip())
    if (git_dir / "rebase-apply").exists() or (git_dir / "rebase-merge").exists():
        raise ToolError(f"{target} is in the middle of a git am or rebase; finish or abort it first")
    if check:
        # A dry run patches a copy of the touched files; git am -3 may still succeed where this reports a conflict.
        result = apply_to_tree(series, target, check=True)
        return ApplyResult(result.target, "git", result.applied, True)
    if not series.patches:
        return ApplyResult(target, "git", (), False)
    head = run_git(["rev-parse", "HEAD"], target).stdout.strip()
    env = {} if run_git(["var", "GIT_COMMITTER_IDENT"], target, check=False).returncode == 0 else {
        "GIT_COMMITTER_NAME": "lightning-xpu", "GIT_COMMITTER_EMAIL": "apply@lightning-xpu.invalid"}
    skipped = []
    for index, patch in enumerate(series.patches):
        before = run_git(["rev-parse", "HEAD"], target).stdout.strip()
        proc = run_git(["am", "-3", "--quiet", str(patch.path)], target, env=env, check=False)
        if proc.returncode != 0:
            message = describe_failure(patch, proc.stderr + proc.stdout)
            if "hunk" not in message:
                # git am -3 reports conflicts per file; a plain apply on the same state names the hunk.
                message = _hunk_report(target, patch) or message
            run_git(["am", "--abort"], target, env=env, check=False)
            run_git(["reset", "--hard", "--quiet", head], target, env=env)
            applied = f" (after {index} patches applied cleanly)" if index else ""
            raise PatchFailed(f"{message}{applied}; {target} is back at {head[:12]}")
        if run_git(["rev-parse", "HEAD"], target).stdout.strip() == before:
            skipped.append(patch.name)  # git am -3 found the change already present and made no commit
    applied = tuple(p.name for p in series.patches if p.name not in skipped)
    return ApplyResult(target, "git", applied, False, tuple(skipped))


def _hunk_report(target: Path, patch: Patch) -> str | None:
    """Re-apply ``patch`` to copies of its files at the current HEAD (mid ``git am``) to find the hunk."""
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-hunk-") as tmp:
        for rel in patch.files:
            blob = subprocess.run([git_executable(), "show", f"HEAD:{rel}"], cwd=target, env=clean_env(),
                                  capture_output=True)
            if blob.returncode == 0:
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_bytes(blob.stdout)
        proc = run_git(["apply", "--verbose", str(patch.path)], Path(tmp),
                       env={"GIT_CEILING_DIRECTORIES": tmp}, check=False)
        return describe_failure(patch, proc.stderr + proc.stdout) if proc.returncode != 0 else None


def apply(series: Series, target: Path, *, check: bool = False) -> ApplyResult:
    """Apply to a git checkout when ``target`` is the top of a git work tree, else to a plain tree."""
    target = _existing_dir(target)
    if is_git_toplevel(target):
        return apply_to_git(series, target, check=check)
    return apply_to_tree(series, target, check=check)


def _existing_dir(path: Path) -> Path:
    path = Path(path).resolve()
    if not path.is_dir():
        raise ToolError(f"{path} is not a directory")
    if not (path / "src" / "lightning").is_dir():
        raise ToolError(f"{path} does not look like a Lightning source tree: it has no src/lightning/ directory")
    return path


def master_variant_for(series_dir: Path, target: Path) -> Path | None:
    """The master variant kept in ``series_dir`` when ``target`` is a git checkout whose history has its base."""
    master = series_dir / MASTER_VARIANT
    if not is_upstream_series(master) or not Path(target).is_dir() or not is_git_toplevel(Path(target)):
        return None
    commit = load_upstream_base(master).commit
    proc = run_git(["merge-base", "--is-ancestor", commit, "HEAD"], Path(target), check=False)
    return master if proc.returncode == 0 else None


def master_variant_hint(series_dir: Path) -> str:
    """What to say when the release series in ``series_dir`` does not apply to a target."""
    master = series_dir / MASTER_VARIANT
    if not is_upstream_series(master):
        return ("if TARGET is upstream's master branch, apply the master variant: --series patches/master of a "
                "lightning-xpu checkout")
    shown = os.path.relpath(master) if master.resolve().is_relative_to(Path.cwd().resolve()) else str(master)
    base = load_upstream_base(master)
    return (f"this is the release series (against the sdist); if TARGET is upstream's {base.ref} branch, apply the "
            f"master variant (against {base.ref} at {base.short}): add --series {shown}")
