"""Series made against an upstream git commit (the master variant): their base record and trees from a checkout.

``patches/master/base.toml`` names the upstream repository and commit::

    [upstream]
    repository = "https://github.com/Lightning-AI/pytorch-lightning"
    ref = "master"
    commit = "7f0c3436cd3f6ad3753125672024fc415cbcb414"

Such a series is applied to a git checkout of upstream that has the commit (``--upstream CHECKOUT`` or
``$LIGHTNING_UPSTREAM_CHECKOUT``); nothing is downloaded. Mirrors that leave out some large blobs (images under
``docs/``) still work: those files are left out of the workspace's base commit, and the command says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu._git import clean_env, git_executable, run_git
from lightning_xpu.base import BASE_FILE
from lightning_xpu.errors import ToolError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CHECKOUT_VAR = "LIGHTNING_UPSTREAM_CHECKOUT"
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class UpstreamBase:
    """The base of a series made against upstream's git history: a repository, a ref name and a pinned commit."""

    repository: str
    ref: str
    commit: str

    @property
    def short(self) -> str:
        return self.commit[:12]


def _read(series_dir: Path) -> dict:
    path = series_dir / BASE_FILE
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"the base record {path} is missing") from None
    except tomllib.TOMLDecodeError as err:
        raise ToolError(f"the base record {path} is malformed ({err})") from None


def is_upstream_series(series_dir: Path) -> bool:
    """Whether the series in ``series_dir`` is made against an upstream commit rather than the sdists."""
    return (series_dir / BASE_FILE).is_file() and "upstream" in _read(series_dir)


def load_upstream_base(series_dir: Path) -> UpstreamBase:
    """Read the ``[upstream]`` table of ``base.toml``."""
    path = series_dir / BASE_FILE
    table = _read(series_dir).get("upstream")
    if not isinstance(table, dict):
        raise ToolError(f"the base record {path} has no [upstream] table; this series is made against the sdists")
    try:
        base = UpstreamBase(str(table["repository"]), str(table["ref"]), str(table["commit"]).lower())
    except KeyError as err:
        raise ToolError(f"the base record {path} is malformed (its [upstream] table lacks {err})") from None
    if not _SHA.fullmatch(base.commit):
        raise ToolError(f"the base record {path} names commit {base.commit!r}; it must be a full 40-digit sha")
    return base


def resolve_checkout(checkout: Path | None, base: UpstreamBase) -> Path:
    """The upstream checkout to use (argument, else ``$LIGHTNING_UPSTREAM_CHECKOUT``); it must have the commit."""
    if checkout is None and os.environ.get(CHECKOUT_VAR):
        checkout = Path(os.environ[CHECKOUT_VAR])
    if checkout is None:
        raise ToolError(f"this series is made against {base.repository} at {base.short} ({base.ref}); pass "
                        f"--upstream CHECKOUT (a git clone that has that commit) or set {CHECKOUT_VAR}")
    checkout = Path(checkout).expanduser().resolve()
    if not checkout.is_dir() or run_git(["rev-parse", "--git-dir"], checkout, check=False).returncode != 0:
        raise ToolError(f"{checkout} is not a git checkout of {base.repository}")
    if run_git(["cat-file", "-e", f"{base.commit}^{{commit}}"], checkout, check=False).returncode != 0:
        raise ToolError(f"{checkout} does not have commit {base.short}; fetch {base.ref} of {base.repository} "
                        "into it first")
    return checkout


def missing_blobs(repo: Path, commit: str) -> list[str]:
    """Paths of files in ``commit`` whose contents ``repo`` lacks (mirrors may leave out large blobs)."""
    listing = run_git(["ls-tree", "-r", "--full-tree", commit], repo).stdout.splitlines()
    entries = [(line.split()[2], line.split("\t", 1)[1]) for line in listing if line.split()[1] == "blob"]
    proc = subprocess.run([git_executable(), "cat-file", "--batch-check=%(objectname) %(objecttype)"], cwd=repo,
                          env=clean_env(), text=True, input="".join(f"{sha}\n" for sha, _ in entries),
                          capture_output=True)
    missing = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith(" missing")}
    return [path for sha, path in entries if sha in missing]


def checkout_commit(repo: Path, commit: str, ident: dict[str, str]) -> list[str]:
    """Check out ``commit`` on branch ``main`` in the fresh clone ``repo``; leave out files whose blobs are missing.

    Returns the paths left out. They are kept out of the work tree with a sparse checkout and removed from the index
    in one extra commit (made with ``ident``), because git cannot write a tree that names a blob it does not have.
    """
    dropped = missing_blobs(repo, commit)
    if dropped:
        run_git(["sparse-checkout", "set", "--no-cone", "/*", *(f"!/{path}" for path in dropped)], repo)
    run_git(["checkout", "--quiet", "-B", "main", commit], repo)
    if dropped:
        run_git(["update-index", "--force-remove", "--", *dropped], repo)
        message = "Leave out files whose contents this checkout lacks\n\n" + "".join(f"{p}\n" for p in dropped)
        run_git(["commit", "--quiet", "--no-verify", "-m", message], repo, env=ident, isolate_config=True)
    return dropped


def export_tree(checkout: Path, base: UpstreamBase, directory: Path) -> list[str]:
    """Write the files of the base commit into ``directory`` (a plain tree, like an unpacked sdist).

    Returns the paths left out because the checkout lacks their contents.
    """
    dropped = missing_blobs(checkout, base.commit)
    directory.mkdir(parents=True, exist_ok=True)
    pathspec = [".", *(f":(exclude){path}" for path in dropped)]
    with tempfile.TemporaryFile() as archive:
        proc = subprocess.run([git_executable(), "archive", "--format=tar", base.commit, "--", *pathspec],
                              cwd=checkout, env=clean_env(), stdout=archive, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise ToolError(f"`git archive {base.short}` failed in {checkout}: {proc.stderr.decode().strip()}")
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            try:
                tar.extractall(directory, filter="data")
            except TypeError:  # pragma: no cover - Python without extraction filters
                tar.extractall(directory)
    return dropped
