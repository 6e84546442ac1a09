"""Build small fake patch series (``git format-patch`` files plus a quilt ``series``) for the CI checks' tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_IDENT = {
    "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.invalid", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}

Files = dict[str, "str | None"]  # path -> new content, None deletes


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **_IDENT}, check=True,
                          capture_output=True, text=True).stdout


def write(tree: Path, files: Files) -> None:
    for rel, content in files.items():
        path = tree / rel
        if content is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)


def init_repo(repo: Path, files: Files, message: str = "base") -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, message, files)


def commit(repo: Path, subject: str, files: Files) -> None:
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject, "-m", "Test patch.")


def make_series(repo: Path, since: str, out: Path) -> Path:
    """Export the commits after ``since`` in ``repo`` as a series directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    names = git(repo, "format-patch", "--zero-commit", "--no-signature", "-o", str(out), since).split()
    (out / "series").write_text("".join(Path(n).name + "\n" for n in names))
    return out


FAKE_BASE: Files = {
    "src/lightning/__init__.py": "",
    "src/lightning/fabric/__init__.py": "",
    "src/lightning/pytorch/__init__.py": "",
    "src/lightning/fabric/calc.py": '"""Arithmetic."""\n\n\ndef add(a, b):\n    return a + b\n',
}
