"""A git merge driver for Lightning's CHANGELOG.md files, used when the series is ported onto upstream master.

Every upstream pull request adds lines to the same ``## [unreleased]`` sections, so a patch's CHANGELOG hunk never
applies to a later upstream commit as it is. This driver takes the entries the patch adds ("theirs" against the
merge base) and appends each at the end of the same ``###`` section of the release section in the upstream file
("ours"), in upstream's spacing (a blank line between entries where upstream has one), replacing the empty ``-``
placeholder of a section that has no entry yet. Anything else (a patch that removes or rewrites an upstream line, a
section upstream does not have) is left to a human: the driver then writes git's usual conflict markers.

    git config merge.lightning-xpu-changelog.driver "python -m lightning_xpu.changelog_merge %O %A %B"
    echo "CHANGELOG.md merge=lightning-xpu-changelog" >> .git/info/attributes
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_xpu._git import clean_env, git_executable

DRIVER = "lightning-xpu-changelog"
PLACEHOLDER = "-"


class Unmergeable(Exception):
    """The change is not "add entries to sections"; a human has to merge it."""


def _section(lines: Sequence[str], index: int) -> tuple[str, str]:
    """The ``## `` release heading and ``### `` section heading above line ``index``."""
    release = section = ""
    for line in lines[:index]:
        if line.startswith("## "):
            release, section = line, ""
        elif line.startswith("### "):
            section = line
    return release, section


def added_entries(base: list[str], theirs: list[str]) -> list[tuple[tuple[str, str], list[str]]]:
    """The entries ``theirs`` adds to ``base``, each with the (release, section) headings it is added under."""
    added = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, base, theirs, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        removed = [line for line in base[i1:i2] if line.strip()]
        if removed and removed != [PLACEHOLDER]:
            raise Unmergeable(f"the patch removes or rewrites {removed[0]!r}")
        entries = [line for line in theirs[j1:j2] if line.strip()]
        if any(line.startswith("#") for line in entries):
            raise Unmergeable("the patch adds a heading")
        if entries:
            added.append((_section(base, i1), entries))
    return added


def insert_entries(ours: list[str], headings: tuple[str, str], entries: list[str]) -> list[str]:
    """``ours`` with ``entries`` appended at the end of the section named by ``headings``."""
    release, section = headings
    start = next((i for i, line in enumerate(ours)
                  if line == (section or release) and _section(ours, i + 1) == (release, section)), None)
    if start is None:
        raise Unmergeable(f"upstream's file has no section {section!r} under {release!r}")
    end = next((i for i in range(start + 1, len(ours)) if ours[i].startswith(("#", "--"))), len(ours))
    body = [i for i in range(start + 1, end) if ours[i].strip()]
    block = [x for entry in entries for x in (["", entry] if _spaced(ours) else [entry])]
    if [ours[i] for i in body] == [PLACEHOLDER]:
        return [*ours[: body[0]], *block[block.index(entries[0]):], *ours[body[0] + 1:]]
    last = body[-1] if body else start
    return [*ours[: last + 1], *block, *ours[last + 1:]]


def _spaced(lines: list[str]) -> bool:
    """Whether the file separates entries with a blank line, as Lightning's changelogs do."""
    triples = zip(lines, lines[1:], lines[2:], strict=False)
    return any(a.startswith("- ") and not b.strip() and c.startswith("- ") for a, b, c in triples)


def merge(base: str, ours: str, theirs: str) -> str:
    """The merged CHANGELOG text, or raise ``Unmergeable``."""
    result = ours.splitlines()
    for headings, entries in added_entries(base.splitlines(), theirs.splitlines()):
        result = insert_entries(result, headings, entries)
    return "\n".join(result) + ("\n" if ours.endswith("\n") else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Merge driver entry point: ``BASE OURS THEIRS``; writes the result to OURS, exits 1 on a conflict."""
    base_path, ours_path, theirs_path = (Path(p) for p in (argv if argv is not None else sys.argv[1:]))
    texts = [p.read_text(encoding="utf-8") for p in (base_path, ours_path, theirs_path)]
    try:
        ours_path.write_text(merge(*texts), encoding="utf-8")
        return 0
    except Unmergeable as err:
        print(f"{DRIVER}: {err}; leaving conflict markers", file=sys.stderr)
        proc = subprocess.run([git_executable(), "merge-file", "-L", "ours", "-L", "base", "-L", "theirs",
                               str(ours_path), str(base_path), str(theirs_path)], env=clean_env())
        return 1 if proc.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
