"""Every added source line outside the XPU modules that names XPU, each with its CUDA/MPS counterpart or its reason.

A reviewer counts the lines of shared code a new accelerator needs: every line the series adds under ``src/`` (not a
CHANGELOG, not a comment, docstrings included) that names XPU (any case) or xccl, in a file whose path does not
contain ``xpu``. A line is counted per patch that adds it, as ``/work/shared/tools/series_shape.awk`` counts its
"wide" figure: a line added by one patch and changed by a later one counts twice.

Each line must be explained by an entry of ``ci/xpu_lines.toml``: a file, a regular expression searched in the
line, and either the ``counterpart`` it stands beside (CUDA's or MPS's line that does the same) or the ``reason``
XPU needs it. The first entry of the file whose pattern matches explains the line.

    python ci/xpu_lines.py [--series patches/master]                   # list the lines, by file
    python ci/xpu_lines.py --check                                     # fail on an unexplained line or a stale entry
    python ci/xpu_lines.py --markdown                                  # the table COVER.md carries
    python ci/xpu_lines.py --check-cover patches/master/COVER.md       # fail when COVER.md's table differs

Exit status: 0 when all is explained (and COVER.md's table is current), 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.series import load_series  # noqa: E402

TABLE = Path(__file__).resolve().parent / "xpu_lines.toml"
NAMES_XPU = re.compile(r"xpu|xccl", re.IGNORECASE)
BEGIN = "<!-- xpu-lines: the output of `python ci/xpu_lines.py --markdown`; --check-cover compares it -->"
END = "<!-- /xpu-lines -->"
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


@dataclass(frozen=True)
class Line:
    """One added line: the patch that adds it (1-based), the file and the line without its indentation."""

    patch: int
    file: str
    text: str


@dataclass(frozen=True)
class Entry:
    """A reason-table entry: lines of ``file`` matching ``pattern`` stand beside ``counterpart`` or need ``reason``."""

    file: str
    pattern: str
    counterpart: str
    reason: str

    @property
    def why(self) -> str:
        return f"beside {self.counterpart}" if self.counterpart else self.reason

    def matches(self, line: Line) -> bool:
        return line.file == self.file and re.search(self.pattern, line.text) is not None


def counted(path: str) -> bool:
    """A source file outside the XPU modules (series_shape.awk's ``wide``)."""
    return path.startswith("src/") and "xpu" not in path and "CHANGELOG" not in path


def added_lines(series_dir: Path) -> list[Line]:
    """The added lines naming XPU outside the XPU modules, per patch, as series_shape.awk counts them."""
    lines = []
    for number, patch in enumerate(load_series(series_dir).patches, 1):
        current = ""
        for raw in patch.path.read_text(encoding="utf-8").splitlines():
            if m := _DIFF.match(raw):
                current = m.group(1)
            elif raw.startswith("+") and not raw.startswith("+++") and counted(current):
                text = raw[1:].lstrip(" \t")
                if text and not text.startswith("#") and NAMES_XPU.search(text):
                    lines.append(Line(number, current, text.rstrip()))
    return lines


def load_table(path: Path = TABLE) -> list[Entry]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"the reason table {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ToolError(f"the reason table {path} is malformed ({err})") from None
    entries = []
    for index, item in enumerate(data.get("line", []), 1):
        counterpart, reason = item.get("counterpart", ""), item.get("reason", "")
        if not item.get("file") or not item.get("pattern") or bool(counterpart) == bool(reason):
            raise ToolError(f"{path}: entry {index} needs `file`, `pattern` and exactly one of `counterpart` and "
                            "`reason`")
        try:
            re.compile(item["pattern"])
        except re.error as err:
            raise ToolError(f"{path}: entry {index}'s pattern {item['pattern']!r} is not a regular expression "
                            f"({err})") from None
        entries.append(Entry(item["file"], item["pattern"], counterpart, reason))
    return entries


def explain(lines: list[Line], entries: list[Entry]) -> tuple[dict[Entry, list[Line]], list[Line], list[Entry]]:
    """``(lines per entry, unexplained lines, stale entries)``."""
    matched: dict[Entry, list[Line]] = {entry: [] for entry in entries}
    unexplained = []
    for line in lines:
        entry = next((e for e in entries if e.matches(line)), None)
        if entry is None:
            unexplained.append(line)
        else:
            matched[entry].append(line)
    return matched, unexplained, [e for e, found in matched.items() if not found]


def short(path: str) -> str:
    return path.removeprefix("src/lightning/")


def markdown(lines: list[Line], entries: list[Entry]) -> str:
    """The table for COVER.md: one row per reason-table entry, in the table's order."""
    matched, unexplained, _ = explain(lines, entries)
    if unexplained:
        raise ToolError(f"{len(unexplained)} line(s) have no entry in {TABLE.name}; run --check")
    files = {line.file for line in lines}
    out = [f"{len(lines)} added lines of source outside the XPU modules name XPU, in {len(files)} files (counted per "
           "patch, comments left out, docstrings in); each stands beside its CUDA or MPS counterpart or has a reason "
           "of XPU's own:", "", "| file | lines | for example | counterpart or reason |", "|---|---|---|---|"]
    for entry, found in matched.items():
        if found:
            example = found[0].text if len(found[0].text) <= 70 else found[0].text[:67] + "..."
            out.append(f"| `{short(entry.file)}` | {len(found)} | {code_span(example)} | {entry.why} |")
    return "\n".join(out)


def code_span(text: str) -> str:
    """``text`` as a markdown code span inside a table cell, whatever backticks and pipes it holds."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padded = f" {text} " if "`" in text else text
    return fence + padded.replace("|", "\\|") + fence


def cover_block(cover: Path) -> str:
    text = cover.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ToolError(f"{cover} has no xpu-lines block: put the output of `python ci/xpu_lines.py --markdown` "
                        f"between the lines\n{BEGIN}\n{END}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def listing(lines: list[Line], entries: list[Entry]) -> str:
    matched, unexplained, _ = explain(lines, entries)
    why = {id(line): entry.why for entry, found in matched.items() for line in found}
    out = []
    per_file = Counter(line.file for line in lines)
    for file in sorted(per_file):
        out.append(f"{file}: {per_file[file]}")
        for line in (ln for ln in lines if ln.file == file):
            out.append(f"  [{line.patch:>2}] {line.text}")
            out.append(f"       -> {why.get(id(line), 'UNEXPLAINED')}")
    out.append(f"{len(lines)} lines in {len(per_file)} files; {len(unexplained)} unexplained")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=Path, default=REPO / "patches" / "master", help="series directory "
                        "(default: patches/master)")
    parser.add_argument("--table", type=Path, default=TABLE, help="the reason table (default: ci/xpu_lines.toml)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="fail on an unexplained line or a stale entry")
    group.add_argument("--markdown", action="store_true", help="print the table COVER.md carries")
    group.add_argument("--check-cover", type=Path, metavar="COVER", help="fail when COVER's table differs from "
                       "--markdown's")
    ns = parser.parse_args(argv)
    try:
        lines, entries = added_lines(ns.series.resolve()), load_table(ns.table)
        if ns.markdown:
            print(markdown(lines, entries))
            return 0
        if ns.check_cover:
            expected = markdown(lines, entries)
            if cover_block(ns.check_cover) != expected:
                print(f"xpu-lines: the table in {ns.check_cover} is not the script's; replace its xpu-lines block "
                      f"with the output of `python ci/xpu_lines.py --markdown`:\n{expected}")
                return 1
            print(f"xpu-lines: {ns.check_cover}'s table matches the series ({len(lines)} lines)")
            return 0
        _, unexplained, stale = explain(lines, entries)
        if not ns.check:
            print(listing(lines, entries))
            return 0
        for line in unexplained:
            print(f"UNEXPLAINED {line.file} (patch {line.patch}): {line.text}")
        for entry in stale:
            print(f"STALE {ns.table.name}: no added line of {entry.file} matches {entry.pattern!r}")
        print(f"xpu-lines: {len(lines)} lines in {len({ln.file for ln in lines})} files; {len(unexplained)} "
              f"unexplained, {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}")
        return 1 if unexplained or stale else 0
    except ToolError as err:
        print(f"xpu-lines: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
