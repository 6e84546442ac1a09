"""Upstream's pre-commit hooks for Python, each at its pinned version and with upstream's configuration.

pre-commit (and pre-commit.ci, which upstream's pull requests run) passes every tracked file of a hook's type:
``ruff`` (``ruff check --force-exclude``, run with ``--fix --unsafe-fixes``: a fix is a failure too, so every finding
counts) and ``ruff-format`` on Python files, ``docformatter`` (``--in-place``; checked here by the diff it would
write) on Python files, ``codespell`` on text files. Each reads its configuration from the tree's ``pyproject.toml``
(``[tool.ruff]``, ``[tool.docformatter]``, ``[tool.codespell]``), so each runs from the tree's root.

A hook's findings are records ``(key, text)``: the key leaves out line numbers (lines move between the base and a
pull request's end), the text is what a reader needs. ``new_records`` keeps those the base does not already have.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_xpu.errors import ToolError

Record = tuple[tuple[str, ...], str]
DIFF_LINES = 40  # lines of a reformatting diff shown per file


def _run(cmd: list[str], tree: Path, ok: Iterable[int]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if proc.returncode not in tuple(ok):
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise ToolError(f"`{' '.join(cmd[:3])} ...` failed in {tree} (exit {proc.returncode}):\n{tail}")
    return proc


def ruff_check(ruff: str, tree: Path) -> list[Record]:
    """``ruff check`` on the whole tree, as pre-commit runs it on every Python file."""
    proc = _run([ruff, "check", "--force-exclude", "--no-fix", "--no-cache", "--output-format", "json", "."], tree,
                (0, 1))
    records = []
    for finding in json.loads(proc.stdout or "[]"):
        rel = str(Path(finding["filename"]).resolve().relative_to(tree.resolve()))
        code, message = finding["code"] or "", finding["message"]
        where = f"{rel}:{finding['location']['row']}:{finding['location']['column']}"
        records.append(((rel, code, message), f"{where}: {code} {message}"))
    return records


def ruff_format(ruff: str, tree: Path) -> list[Record]:
    """The files ``ruff format`` would change, each with the start of the diff it would apply."""
    proc = _run([ruff, "format", "--force-exclude", "--no-cache", "--check", "."], tree, (0, 1))
    records = []
    for line in proc.stdout.splitlines():
        if line.startswith("Would reformat: "):
            rel = line.removeprefix("Would reformat: ").strip()
            diff = _run([ruff, "format", "--force-exclude", "--no-cache", "--diff", rel], tree, (0, 1)).stdout
            records.append(((rel,), f"{rel}: would be reformatted\n{_clip(diff)}"))
    return records


def docformatter(exe: str, tree: Path, files: list[str]) -> list[Record]:
    """The docstring rewrites ``docformatter --in-place`` would make in ``files``: one record per diff hunk."""
    files = [f for f in files if f.endswith(".py") and (tree / f).is_file()]
    if not files:
        return []
    proc = _run([exe, *files], tree, (0, 3))
    records = []
    for rel, hunk in _hunks(proc.stdout):
        changed = tuple(line for line in hunk.splitlines()[1:] if line[:1] in "+-")
        records.append(((rel, *changed), f"{rel}: docstring rewritten\n{_clip(hunk)}"))
    return records


def codespell(exe: str, tree: Path, files: list[str]) -> list[Record]:
    """codespell's findings in the text files among ``files``."""
    files = [f for f in files if (tree / f).is_file() and _is_text(tree / f)]
    if not files:
        return []
    proc = _run([exe, *files], tree, (0, 65))
    records = []
    for line in proc.stdout.splitlines():
        m = re.match(r"^(.+?):(\d+): (.+)$", line)
        if m:
            records.append(((m.group(1), m.group(3)), line))
    return records


@contextmanager
def upstream_test_packages(tree: Path) -> Iterator[None]:
    """Give the tree's test folders the ``__init__.py`` files upstream's test tree has, while the hooks run.

    The sdists carry no tests, so the series' test files land in folders without them; ruff's isort rules then read
    ``tests_fabric.helpers`` as a third-party import where upstream's tree makes it first-party (same package), and
    would report every import block of them as unsorted. Removed afterwards, so that the next patches apply.
    """
    made = []
    for suite in ("tests_fabric", "tests_pytorch"):
        root = tree / "tests" / suite
        if not root.is_dir():
            continue
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            marker = folder / "__init__.py"
            if not marker.exists():
                marker.touch()
                made.append(marker)
    try:
        yield
    finally:
        for marker in made:
            marker.unlink(missing_ok=True)


def new_records(base: list[Record], end: list[Record]) -> list[str]:
    """The texts of the records at a pull request's end that the base does not have (counted per key)."""
    left = Counter(key for key, _ in base)
    new = []
    for key, text in end:
        if left[key]:
            left[key] -= 1
        else:
            new.append(text)
    return new


def _hunks(diff: str) -> list[tuple[str, str]]:
    """``(file, hunk)`` of a unified diff (``--- before/PATH`` / ``+++ after/PATH`` headers, as docformatter writes)."""
    hunks: list[tuple[str, str]] = []
    current = ""
    for line in diff.splitlines():
        if line.startswith("--- "):
            current = re.sub(r"^(before|original)/", "", line[4:].split("\t")[0].strip())
        elif line.startswith("+++ "):
            continue
        elif line.startswith("@@"):
            hunks.append((current, line))
        elif hunks and line[:1] in " +-\\":
            hunks[-1] = (hunks[-1][0], hunks[-1][1] + "\n" + line)
    return hunks


def _clip(text: str, lines: int = DIFF_LINES) -> str:
    rows = text.rstrip("\n").splitlines()
    shown = "\n".join(f"    {row}" for row in rows[:lines])
    return shown + (f"\n    ... {len(rows) - lines} more lines" if len(rows) > lines else "")


def _is_text(path: Path) -> bool:
    """pre-commit's ``text`` type: not binary (identify looks for NUL bytes and undecodable content the same way)."""
    data = path.read_bytes()[:8192]
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
