"""Run git with a clean, reproducible configuration and turn its absence into a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_xpu.errors import ToolError

# Identity and date used for every commit the tooling makes itself (the base commit of a workspace),
# so that two workspaces made from the same base have the same base commit id.
BASE_IDENT = {
    "GIT_AUTHOR_NAME": "lightning-xpu",
    "GIT_AUTHOR_EMAIL": "base@lightning-xpu.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "lightning-xpu",
    "GIT_COMMITTER_EMAIL": "base@lightning-xpu.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def git_executable() -> str:
    """Return the path of git, or raise a ToolError saying it is needed."""
    exe = shutil.which("git")
    if exe is None:
        raise ToolError("git is required but was not found on PATH; install git (2.28 or newer) and retry")
    return exe


def clean_env(extra: Mapping[str, str] | None = None, *, isolate_config: bool = False) -> dict[str, str]:
    """An environment for git: no pager, C locale, optionally without the user's and system's config."""
    env = dict(os.environ)
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"):
        env.pop(var, None)
    env.update({"LC_ALL": "C", "LANG": "C", "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0"})
    if isolate_config:
        # User config (diff.noprefix, format.signature, core.abbrev, ...) would change exported patches.
        env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    isolate_config: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `git ARGS` in cwd and capture its output; raise ToolError with git's message when check fails."""
    proc = subprocess.run(
        [git_executable(), *args],
        cwd=cwd,
        env=clean_env(env, isolate_config=isolate_config),
        capture_output=True,
        text=True,
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ToolError(f"`git {' '.join(args[:2])}` failed in {cwd}: {detail[-1] if detail else 'no output'}")
    return proc


def is_git_toplevel(path: Path) -> bool:
    """Whether path is the top level of a git work tree (not merely inside one)."""
    if not (path / ".git").exists():
        return False
    proc = run_git(["rev-parse", "--show-toplevel"], path, check=False)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == path.resolve()
