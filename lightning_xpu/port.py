"""Port the release series onto a master-variant workspace: replay the patches it lacks with ``git am -3``.

The release series (``patches/``) is made against the 2.6.6 sdist; the master variant (``patches/master``) is the
same series rebased onto upstream master, plus the edits to upstream's existing files that only master can carry.
A release patch is in the master workspace when a commit after the base has the same subject. ``port`` applies the
missing ones, in series order, with ``git am -3`` and three aids so that a human is needed only for a real conflict:

- the file versions every release patch starts from and produces are stored in the workspace first, so that the
  three-way merge has the patch's preimage (it is the sdist's, not in upstream's history);
- CHANGELOG.md files merge with ``lightning_xpu.changelog_merge`` (new entries go to the end of their section);
- ``git rerere`` is on, so a conflict resolved once is resolved the same way when the series is ported again;
- test files the patch adds or changes are folded into their upstream namesakes where ``lightning_xpu.testmerge``
  allows, in the patch's own commit (a later change to a folded file is applied to the file and folded again).

A real conflict stops the port with the ``git am`` session open: resolve it, ``git add`` the files,
``git am --continue``, and run ``port`` again for the remaining patches.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lightning_xpu._git import BASE_IDENT, clean_env, git_executable, run_git
from lightning_xpu.errors import ToolError
from lightning_xpu.series import Patch, Series
from lightning_xpu.testmerge import fold_tree, is_candidate, namesake_of, unfold_text

_COMMITTER = {k: BASE_IDENT[k] for k in ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")}
# the temporary unfold commit is squashed into the patch's own commit, which keeps that commit's author; naming
# one here lets `port` run where git has no identity configured
_TEMPORARY_IDENT = {**_COMMITTER, "GIT_AUTHOR_NAME": BASE_IDENT["GIT_AUTHOR_NAME"],
                    "GIT_AUTHOR_EMAIL": BASE_IDENT["GIT_AUTHOR_EMAIL"]}
_TAG = "lightning-xpu/base"
_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.[0-9a-f]+", re.M)


@dataclass
class PortResult:
    """What ``port`` did: patches applied (how), the one that stopped it, and master commits the release lacks."""

    applied: list[tuple[str, str]] = field(default_factory=list)  # (patch name, "clean" | "3-way" | "rerere")
    already_present: list[str] = field(default_factory=list)
    conflict: str | None = None
    conflicted_files: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    master_only: list[str] = field(default_factory=list)
    carried: list[tuple[str, list[str]]] = field(default_factory=list)  # (patch name, files carried over)
    # (patch name, files that it and its earlier master version both change, adding different lines)
    check: list[tuple[str, list[str]]] = field(default_factory=list)
    not_carried: list[str] = field(default_factory=list)  # carry patches whose subject no release patch has


def seed_series_blobs(repo: Path, series: Series, base: Path) -> dict[str, str]:
    """Store in ``repo`` every file version the series' patches start from and produce, applied to ``base``.

    ``git am -3`` merges with the preimage blob a patch names in its ``index`` lines. The release series is made
    against the sdist, so those blobs (the sdist's own files where they differ from git, and every intermediate state
    of the series) are not in upstream's history; without them a patch that does not apply as is can only conflict.
    Returns the series' test files that may fold into a namesake, as the whole series leaves them.
    """
    from lightning_xpu.apply import apply_to_tree

    with tempfile.TemporaryDirectory(prefix="lightning-xpu-blobs-") as tmp:
        work = Path(tmp)
        for rel in series.files:
            if (base / rel).is_file():
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(base / rel, work / rel)
        _hash_objects(repo, work, series.files)
        for patch in series.patches:
            try:
                apply_to_tree(Series(series.directory, (patch,)), work)
            except ToolError:
                return {}  # the series does not apply to its own base: the bisect check reports that
            _hash_objects(repo, work, patch.files)
        return {rel: (work / rel).read_text(encoding="utf-8") for rel in series.files
                if is_candidate(rel) and (work / rel).is_file()}


def _hash_objects(repo: Path, work: Path, files: tuple[str, ...]) -> None:
    paths = [str(work / rel) for rel in files if (work / rel).is_file()]
    if paths:
        subprocess.run([git_executable(), "hash-object", "-w", "--stdin-paths"], cwd=repo, env=clean_env(),
                       input="\n".join(paths) + "\n", text=True, capture_output=True, check=True)


def configure(repo: Path) -> None:
    """Turn on rerere and the CHANGELOG merge driver in ``repo`` (its own config, not the user's)."""
    driver = f"{shlex.quote(sys.executable)} -m lightning_xpu.changelog_merge %O %A %B"
    for key, value in (("rerere.enabled", "true"), ("rerere.autoupdate", "true"),
                       ("merge.lightning-xpu-changelog.name", "lightning-xpu CHANGELOG entries"),
                       ("merge.lightning-xpu-changelog.driver", driver)):
        run_git(["config", key, value], repo)
    git_dir = Path(run_git(["rev-parse", "--absolute-git-dir"], repo).stdout.strip())
    attributes = git_dir / "info" / "attributes"
    attributes.parent.mkdir(parents=True, exist_ok=True)
    line = "CHANGELOG.md merge=lightning-xpu-changelog\n"
    text = attributes.read_text() if attributes.is_file() else ""
    if line not in text:
        attributes.write_text(text + line)


def workspace_subjects(repo: Path) -> list[str]:
    """Subjects of the commits after the base tag, oldest first."""
    if run_git(["rev-parse", "--verify", "--quiet", f"refs/tags/{_TAG}"], repo, check=False).returncode != 0:
        raise ToolError(f"{repo} has no tag {_TAG}; make it with `lightning-xpu workspace --series patches/master`")
    return run_git(["log", "--reverse", "--format=%s", f"{_TAG}..HEAD"], repo).stdout.splitlines()


def port(series: Series, repo: Path, base_tree: Path, carry: Series | None = None) -> PortResult:
    """Apply to the workspace ``repo`` the patches of ``series`` whose subject it lacks; stop at a real conflict.

    ``carry``: an earlier master variant. After each release patch, the edits its namesake in ``carry`` (same subject)
    makes to files the release patch does not touch (upstream's own tests, conftests and docs) are applied too, in the
    same commit, so a re-ported series keeps them.
    """
    repo = Path(repo).resolve()
    git_dir = Path(run_git(["rev-parse", "--absolute-git-dir"], repo).stdout.strip())
    if (git_dir / "rebase-apply").exists() or (git_dir / "rebase-merge").exists():
        raise ToolError(f"{repo} is in the middle of a git am or rebase; finish it (git am --continue) first")
    if run_git(["status", "--porcelain", "--untracked-files=no"], repo).stdout.strip():
        raise ToolError(f"{repo} has uncommitted changes; commit them before porting")
    pending = _pending(repo)
    present = workspace_subjects(repo)
    subjects = [p.subject for p in series.patches]
    result = PortResult(master_only=[s for s in present if s not in subjects])
    carried = {p.subject: p for p in carry.patches} if carry else {}
    result.not_carried = [p.name for p in carry.patches if p.subject not in subjects] if carry else []
    todo = [p for p in series.patches if p.subject not in present]
    if not todo and not pending:
        return result
    last_present = max((subjects.index(s) for s in present if s in subjects), default=-1)
    result.out_of_order = [p.name for p in todo if subjects.index(p.subject) < last_present]
    configure(repo)
    final = seed_series_blobs(repo, series, base_tree)
    by_name = {p.name: p for p in series.patches}
    if pending and pending.get("patch") in by_name and present and present[-1] == by_name[pending["patch"]].subject:
        # a human resolved the conflict this patch stopped at: finish what port does after applying a patch
        patch = by_name[pending["patch"]]
        _fold(repo, patch, pending.get("unfolded", []), final)
        todo.insert(0, patch)
        skip_am = {patch.name}
    else:
        skip_am = set()
    for patch in todo:
        if patch.name in skip_am:
            outcome = "resolved"
        else:
            outcome, unfolded = _am(repo, patch, final)
            if outcome is None:
                _set_pending(repo, {"patch": patch.name, "unfolded": unfolded})
                result.conflict = patch.name
                result.conflicted_files = run_git(["diff", "--name-only", "--diff-filter=U"], repo).stdout.split()
                return result
        _set_pending(repo, None)
        if outcome == "present":
            result.already_present.append(patch.name)
            continue
        result.applied.append((patch.name, outcome))
        if patch.subject in carried:
            earlier = carried[patch.subject]
            both = [f for f in earlier.files if f in patch.files and not f.endswith("CHANGELOG.md")
                    and _added(earlier, f) != _added(patch, f)]
            if both:
                result.check.append((patch.name, both))
            files = _carry(repo, patch, carried[patch.subject])
            if files is None:
                result.conflict = f"{carried[patch.subject].name} (its edits carried over from {carry.directory})"
                result.conflicted_files = run_git(["diff", "--name-only", "--diff-filter=U"], repo).stdout.split()
                return result
            if files:
                result.carried.append((patch.name, files))
    return result


def _added(patch: Patch, path: str) -> list[str]:
    """The lines ``patch`` adds to ``path``, in order."""
    text = patch.path.read_text(encoding="utf-8").split(f"diff --git a/{path} b/{path}\n", 1)
    if len(text) < 2:
        return []
    section = text[1].split("\ndiff --git ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("+") and not line.startswith("+++")]


def _in_base(repo: Path, path: str) -> bool:
    return run_git(["cat-file", "-e", f"{_TAG}:{path}"], repo, check=False).returncode == 0


def _carry(repo: Path, patch: Patch, earlier: Patch) -> list[str] | None:
    """Apply ``earlier``'s changes to the files ``patch`` does not touch, amending the commit ``patch`` made.

    Returns the files carried over, or None when they conflict (left with conflict markers for a human)."""
    # a namesake the patch's test file was folded into carries that fold, not the earlier variant's edits
    own = set(patch.files) | {namesake_of(p, repo) for p in patch.files
                              if is_candidate(p) and not (repo / p).exists()}
    # upstream's own files only: the series' files come from the release patches
    files = [f for f in earlier.files if f not in own and _in_base(repo, f)]
    if not files:
        return []
    proc = run_git(["apply", "-3", "--whitespace=nowarn", *(f"--include={f}" for f in files), str(earlier.path)],
                   repo, check=False)
    if proc.returncode != 0:
        return None
    run_git(["add", "--", *files], repo)
    run_git(["commit", "--quiet", "--no-verify", "--amend", "--no-edit"], repo, env=_COMMITTER)
    return files


def _preimage(patch: Patch, path: str) -> str | None:
    """The blob id ``patch`` names as the version of ``path`` it starts from (None for a new file)."""
    text = patch.path.read_text(encoding="utf-8")
    section = text.split(f"diff --git a/{path} b/{path}\n", 1)
    if len(section) < 2 or not (m := _INDEX.search(section[1].split("\n@@", 1)[0])):
        return None
    return None if set(m.group(1)) == {"0"} else m.group(1)


def _unfold(repo: Path, patch: Patch) -> list[str]:
    """Before ``patch`` changes a test file the workspace folded into its namesake, restore the file and take its
    body out of the namesake (one temporary commit); return the restored paths."""
    restored = []
    for path in patch.files:
        blob = _preimage(patch, path)
        if not is_candidate(path) or blob is None or (repo / path).exists():
            continue
        old = run_git(["cat-file", "-p", blob], repo, check=False)
        fold = namesake_of(path, repo)
        if old.returncode != 0 or not fold:
            continue
        namesake = unfold_text((repo / fold).read_text(encoding="utf-8"), old.stdout)
        if namesake is None:
            continue  # not folded as is: git am reports the missing file, and a human decides
        (repo / fold).write_text(namesake, encoding="utf-8")
        (repo / path).write_text(old.stdout, encoding="utf-8")
        restored.append(path)
    if restored:
        run_git(["add", "-A", "--", *restored, *(namesake_of(p, repo) for p in restored)], repo)
        run_git(["commit", "--quiet", "--no-verify", "-m", "lightning-xpu: unfold " + ", ".join(restored)], repo,
                env=_TEMPORARY_IDENT)
    return restored


def _fold(repo: Path, patch: Patch, unfolded: list[str], final: dict[str, str]) -> None:
    """Fold the test files the patch just added or changed, into the patch's own commit."""
    candidates = [p for p in patch.files if is_candidate(p) and (repo / p).is_file()]
    folds = fold_tree(repo, candidates, final)
    if unfolded:  # squash the temporary unfold commit into the patch's commit
        message = run_git(["log", "-1", "--format=%H"], repo).stdout.strip()
        run_git(["reset", "--soft", "HEAD~2"], repo)
        run_git(["add", "-A", "--", "."], repo)
        run_git(["commit", "--quiet", "--no-verify", "-C", message], repo, env=_COMMITTER)
    elif any(f.folds for f in folds):
        run_git(["add", "-A", "--", "."], repo)
        run_git(["commit", "--quiet", "--no-verify", "--amend", "--no-edit"], repo, env=_COMMITTER)


def _am(repo: Path, patch: Patch, final: dict[str, str]) -> tuple[str | None, list[str]]:
    """Apply one patch; return how ("clean", "3-way", "rerere", "present"), or None with the am session open, and
    the test files restored from their namesakes for it."""
    unfolded = _unfold(repo, patch)
    how = _am_one(repo, patch)
    if how in ("clean", "3-way", "rerere"):
        _fold(repo, patch, unfolded, final)
    elif how == "present" and unfolded:
        run_git(["reset", "--hard", "--quiet", "HEAD~1"], repo)
    return how, unfolded


def _pending_file(repo: Path) -> Path:
    return Path(run_git(["rev-parse", "--absolute-git-dir"], repo).stdout.strip()) / "lightning-xpu-port-pending.json"


def _pending(repo: Path) -> dict | None:
    path = _pending_file(repo)
    return json.loads(path.read_text()) if path.is_file() else None


def _set_pending(repo: Path, value: dict | None) -> None:
    """Remember the patch a conflict stopped at, so that the next run folds and carries for it once resolved."""
    path = _pending_file(repo)
    if value is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(json.dumps(value))


def _am_one(repo: Path, patch: Patch) -> str | None:
    head = run_git(["rev-parse", "HEAD"], repo).stdout.strip()
    check = run_git(["apply", "--check", str(patch.path)], repo, check=False)
    proc = run_git(["am", "-3", "--quiet", "--committer-date-is-author-date", str(patch.path)], repo,
                   env=_COMMITTER, check=False)
    how = "clean" if check.returncode == 0 else "3-way"
    if proc.returncode != 0:
        if run_git(["diff", "--name-only", "--diff-filter=U"], repo).stdout.strip():
            return None
        # rerere resolved every conflict and staged the result
        cont = run_git(["am", "--continue"], repo, env={**_COMMITTER, "GIT_EDITOR": "true"}, check=False)
        if cont.returncode != 0:
            return None
        how = "rerere"
    return "present" if run_git(["rev-parse", "HEAD"], repo).stdout.strip() == head else how
