"""The pull requests of ``patches/master/COVER.md``: their headings, patch ranges and "Needs" lines.

Each pull request is a section headed ``## PR N: title (patches a-b)`` with one ``**Needs:** ...`` line that names
the earlier pull requests it needs ("PR 1", "PRs 1-3", "PR 3; PR 1's barriers", or "nothing"). The ranges must follow
one another without gaps or overlaps and cover the series exactly: anything else is an error naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.errors import ToolError

HEADING = re.compile(r"^## PR (\d+): (\S.*?) \(patches (\d+)-(\d+)\)$")
# a heading that tries to be a pull request's ("## PR 3 ...", "### Pull request 2"): held to the exact form
_PR_LIKE = re.compile(r"^#{1,6}\s*(?:PRs?|pull requests?)\b", re.IGNORECASE)
_SECTION = re.compile(r"^#{1,2}\s")
_NEEDS = re.compile(r"^\*\*Needs:\*\*\s*(.*)$")
# "PR 3", "PRs 1-3", "PRs 1, 2 and 4", "PR 1's"
_NAMED = re.compile(r"\bPRs?\s+(\d+(?:\s*(?:-|–|,|and|&)\s*\d+)*)")


@dataclass(frozen=True)
class PullRequest:
    """One pull request of the cover letter: patches ``first``..``last`` (1-based) and the PRs it needs."""

    number: int
    title: str
    first: int
    last: int
    needs: tuple[int, ...]
    needs_text: str

    @property
    def label(self) -> str:
        span = f"patch {self.first}" if self.first == self.last else f"patches {self.first}-{self.last}"
        return f"PR {self.number} ({span})"


def parse_needs(text: str, number: int, where: str) -> tuple[int, ...]:
    """The pull requests a "Needs" line names; "nothing" names none. Each must come before PR ``number``."""
    named: set[int] = set()
    for match in _NAMED.finditer(text):
        for part in re.split(r"\s*(?:,|and|&)\s*", match.group(1)):
            bounds = [int(n) for n in re.split(r"\s*[-–]\s*", part)]
            start, end = bounds[0], bounds[-1]
            if end < start:
                raise ToolError(f"{where}: the range PRs {start}-{end} runs backwards")
            named.update(range(start, end + 1))
    nothing = re.match(r"nothing\b", text.strip(), re.IGNORECASE) is not None
    if nothing and named:
        raise ToolError(f"{where}: it says \"nothing\" and names PR(s) {sorted(named)}; say one or the other")
    if not nothing and not named:
        raise ToolError(f"{where}: it names no pull request (write \"PR 1\", \"PRs 1-3\" or \"nothing\")")
    later = sorted(n for n in named if n >= number)
    if later:
        raise ToolError(f"{where}: PR {number} cannot need PR(s) {later}, which are not before it")
    return tuple(sorted(named))


def parse_cover(path: Path, patches: int) -> list[PullRequest]:
    """The pull requests of the cover letter at ``path`` for a series of ``patches`` patches."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ToolError(f"the cover letter {path} does not exist") from None
    prs: list[PullRequest] = []
    current: dict | None = None

    def close() -> None:
        if current is None:
            return
        if current["needs"] is None:
            raise ToolError(f"{path}:{current['line']}: PR {current['number']} has no `**Needs:** ...` line")
        prs.append(PullRequest(current["number"], current["title"], current["first"], current["last"],
                               current["needs"], current["needs_text"]))

    for lineno, line in enumerate(lines, 1):
        where = f"{path}:{lineno}"
        if _SECTION.match(line):
            close()
            current = None
        if not _PR_LIKE.match(line):
            if current is not None and (m := _NEEDS.match(line)):
                if current["needs"] is not None:
                    raise ToolError(f"{where}: PR {current['number']} has a second **Needs:** line")
                text = " ".join([m.group(1), *_continuation(lines, lineno)]).strip()
                current["needs"] = parse_needs(text, current["number"], where)
                current["needs_text"] = text
            continue
        m = HEADING.match(line)
        if m:
            number, title, first, last = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        else:
            raise ToolError(f"{where}: the heading {line!r} is not of the form `## PR N: title (patches a-b)`")
        current = {"number": number, "title": title, "first": first, "last": last, "needs": None,
                   "needs_text": "", "line": lineno}
    close()
    _check_ranges(path, prs, patches)
    return prs


def _continuation(lines: list[str], lineno: int) -> list[str]:
    """The lines that continue the paragraph after line ``lineno`` (1-based): up to a blank line or a new block."""
    rest = []
    for line in lines[lineno:]:
        if not line.strip() or line.startswith(("#", "|", "**", "- ", "* ")):
            break
        rest.append(line.strip())
    return rest


def _check_ranges(path: Path, prs: list[PullRequest], patches: int) -> None:
    """PRs numbered 1..n in order, ranges consecutive from patch 1 to the series' last patch."""
    if not prs:
        raise ToolError(f"{path} has no `## PR N: title (patches a-b)` heading")
    expected_first = 1
    for index, pr in enumerate(prs, 1):
        if pr.number != index:
            raise ToolError(f"{path}: the pull requests are numbered {[p.number for p in prs]}; they must be 1, 2, ...")
        if pr.last < pr.first:
            raise ToolError(f"{path}: {pr.label} runs backwards")
        if pr.first > expected_first:
            raise ToolError(f"{path}: patches {expected_first}-{pr.first - 1} belong to no pull request "
                            f"(a gap before PR {pr.number})")
        if pr.first < expected_first:
            raise ToolError(f"{path}: {pr.label} overlaps the pull request before it, which ends at patch "
                            f"{expected_first - 1}")
        expected_first = pr.last + 1
    if prs[-1].last != patches:
        raise ToolError(f"{path}: the pull requests cover patches 1-{prs[-1].last}, but the series has {patches}")
