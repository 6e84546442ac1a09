"""Compare the release series with its master variant: report every change that differs between them.

The release series (``patches/``, against the 2.6.6 sdist) and the master variant (``patches/master``, against
upstream master) should carry the same code wherever master allows. Patches are paired by subject. Within a pair,
each file's changes are cut into blocks (a run of removed and added lines between context lines) and compared
without context or line numbers, so a block that only moved is the same block. For ``CHANGELOG.md`` only the entries
added are compared (their place in the file always differs). Everything else is a difference:

- a patch only in one series;
- a file only one patch of a pair touches (on master: upstream's existing tests and docs, which the sdist lacks);
- a block only in one patch of a pair (code rebased onto master's version of a function).

A release test file (``test_x_xpu.py``, ``test_x_fixes.py``) that the master variant folds into its upstream namesake
(``test_x.py``) is compared by its code lines (imports and the file header left out) and listed as folded when they
are the same.

    python ci/compare_series.py [--release patches] [--master patches/master] [--write FILE | --check FILE]

``--write`` stores the report as Markdown; ``--check`` fails when the stored report is not the current one (so the
list a reviewer reads is always the real one). Exit status: 0, 1 when ``--check`` finds a stale report, 2 on bad
input. Needs neither an upstream checkout nor the sdists: it reads only the patch files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.series import Patch, load_series  # noqa: E402

CHANGELOG = "CHANGELOG.md"
_IMPORTED_NAME = re.compile(r"\s+[A-Za-z_]\w*( as \w+)?,\s*")
Block = tuple[str, ...]


def file_blocks(patch: Patch) -> dict[str, list[Block]]:
    """Per file, the patch's change blocks: runs of ``-``/``+`` lines between context lines, in order."""
    blocks: dict[str, list[Block]] = {}
    current: str | None = None
    run: list[str] = []

    def flush() -> None:
        if current is not None and run:
            blocks.setdefault(current, []).append(tuple(run))
        run.clear()

    in_hunk = False
    for line in patch.path.read_text(encoding="utf-8").splitlines():
        if line.startswith("diff --git "):
            flush()
            current, in_hunk = line.split(" b/", 1)[1], False
            blocks.setdefault(current, [])
        elif line.startswith("@@"):
            flush()
            in_hunk = True
        elif in_hunk and line[:1] in ("-", "+"):
            run.append(line)
        elif in_hunk and line[:1] in (" ", "\\"):
            flush()
        elif in_hunk:  # the mail's signature or the next header
            flush()
            in_hunk = False
    flush()
    return blocks


def _changelog_entries(blocks: list[Block]) -> list[Block]:
    return [(line,) for block in blocks for line in block if line.startswith("+") and line[1:].strip()
            and line[1:].strip() != "-"]


def _namesake(path: str, others: list[str]) -> str:
    """Among ``others``, the file beside ``path`` whose name ``path``'s extends (``test_ddp.py`` for
    ``test_ddp_side_stream.py``), the longest such; or ``""``."""
    stem, parent = Path(path).stem, Path(path).parent
    matches = [o for o in others if Path(o).parent == parent and stem.startswith(Path(o).stem + "_")]
    return max(matches, key=len, default="")


def _code_lines(blocks: list[Block], new_file: bool) -> list[str]:
    """The changed lines of a test file that are not imports (nor, for a new file, its header before the imports)."""
    out, in_import, header = [], False, new_file
    for line in (line for block in blocks for line in block):
        text = line[1:]
        if in_import:
            in_import = text.strip() != ")"
            continue
        if text.startswith(("from ", "import ")):
            in_import, header = text.rstrip().endswith("("), False
            continue
        if header or not text.strip() or _IMPORTED_NAME.fullmatch(text):
            continue  # a name added to an import list that the diff shows without its `from` line
        out.append(line)
    return out


@dataclass
class PairReport:
    """The differences between the release and master versions of one patch."""

    subject: str
    release: str
    master: str
    release_only_files: list[str] = field(default_factory=list)
    master_only_files: list[tuple[str, list[Block]]] = field(default_factory=list)
    blocks: list[tuple[str, list[Block], list[Block]]] = field(default_factory=list)  # file, release-only, master-only
    folded: list[tuple[str, str]] = field(default_factory=list)  # (test file, namesake) whose code is the same

    @property
    def identical(self) -> bool:
        """The same changes, test files folded into their namesakes included."""
        return not (self.release_only_files or self.master_only_files or self.blocks)


def compare_pair(subject: str, release: Patch, master: Patch) -> PairReport:
    report = PairReport(subject, release.name, master.name)
    ours, theirs = file_blocks(release), file_blocks(master)
    created = release.path.read_text(encoding="utf-8")
    for path in list(ours):
        namesake = _namesake(path, [p for p in theirs if p not in ours])
        if path not in theirs and namesake:
            # the master variant folds the series' test file into its upstream namesake: compare the code only
            new_file = f"diff --git a/{path} b/{path}\nnew file mode" in created
            a, b = _code_lines(ours[path], new_file), _code_lines(theirs.pop(namesake), False)
            if a == b:
                report.folded.append((path, namesake))
            else:
                report.blocks.append((f"{path} -> {namesake}", [tuple(a)], [tuple(b)]))
            del ours[path]
    for path in ours:
        if path not in theirs:
            report.release_only_files.append(path)
    for path, blocks in theirs.items():
        if path not in ours:
            report.master_only_files.append((path, blocks))
            continue
        a, b = ours[path], blocks
        if path.endswith(CHANGELOG):
            a, b = _changelog_entries(a), _changelog_entries(b)
        only_a = list((Counter(a) - Counter(b)).elements())
        only_b = list((Counter(b) - Counter(a)).elements())
        if only_a or only_b:
            report.blocks.append((path, [x for x in a if x in only_a], [x for x in b if x in only_b]))
    return report


@dataclass
class Comparison:
    pairs: list[PairReport]
    release_only: list[str]
    master_only: list[str]


def compare(release_dir: Path, master_dir: Path) -> Comparison:
    release, master = load_series(release_dir), load_series(master_dir)
    by_subject = {p.subject: p for p in master.patches}
    pairs = [compare_pair(p.subject, p, by_subject[p.subject]) for p in release.patches if p.subject in by_subject]
    release_subjects = {p.subject for p in release.patches}
    return Comparison(pairs, [p.name for p in release.patches if p.subject not in by_subject],
                      [p.name for p in master.patches if p.subject not in release_subjects])


def _fence(blocks: list[Block], limit: int = 40) -> list[str]:
    lines = [line for block in blocks for line in (*block, "")][:-1]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... {len(lines) - limit} more lines"]
    return ["```diff", *lines, "```"]


def _added_only(blocks: list[Block]) -> bool:
    return len(blocks) == 1 and all(line.startswith("+") for line in blocks[0])


def render(comparison: Comparison) -> str:
    """The report as Markdown."""
    same = [p for p in comparison.pairs if p.identical]
    folded = list(dict.fromkeys(fold for p in comparison.pairs for fold in p.folded))
    out = [
        "# Release series vs master variant",
        "",
        "Generated by `python ci/compare_series.py --write patches/master/DIFFERENCES.md`; `tox -e master-variant` "
        "fails when it is stale. Patches are paired by subject; changes are compared without context or line numbers; "
        f"for {CHANGELOG} only the entries are compared.",
        "",
        f"- {len(comparison.pairs)} patches in both series, {len(same)} of them with identical changes "
        "(a test file folded into its upstream namesake with the same code counts as identical)",
        f"- test files folded into their upstream namesakes: {len(folded)}"
        + "".join(f"\n  - `{a}` -> `{b}`" for a, b in folded),
        f"- only in the release series: {', '.join(comparison.release_only) or 'none'}",
        f"- only in the master variant: {', '.join(comparison.master_only) or 'none'}",
        "",
    ]
    for pair in comparison.pairs:
        if pair.identical:
            continue
        out += [f"## {pair.master}", "", f"{pair.subject}", ""]
        for path in pair.release_only_files:
            out += [f"- `{path}`: changed only in the release series", ""]
        for path, blocks in pair.master_only_files:
            added = sum(line.startswith("+") for b in blocks for line in b)
            removed = sum(line.startswith("-") for b in blocks for line in b)
            out += [f"- `{path}`: changed only on master (+{added} -{removed} lines)", ""]
        for path, release_blocks, master_blocks in pair.blocks:
            out += [f"- `{path}`: {len(release_blocks)} change(s) of the release series differ on master", ""]
            if _added_only(release_blocks) and _added_only(master_blocks):
                # a file both patches create: show how the master variant's version differs
                diff = list(difflib.unified_diff([x[1:] for x in release_blocks[0]], [x[1:] for x in master_blocks[0]],
                                                 "release series", "master variant", n=1, lineterm=""))
                out += [*(f"  {line}" for line in ["```diff", *diff, "```"]), ""]
                continue
            if release_blocks:
                out += ["  release series:", "", *(f"  {line}" for line in _fence(release_blocks)), ""]
            if master_blocks:
                out += ["  master variant:", "", *(f"  {line}" for line in _fence(master_blocks)), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", type=Path, default=REPO / "patches", help="release series (default: patches/)")
    parser.add_argument("--master", type=Path, default=REPO / "patches" / "master",
                        help="master variant (default: patches/master/)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="FILE", help="write the report to FILE")
    group.add_argument("--check", type=Path, metavar="FILE", help="fail unless FILE holds the current report")
    ns = parser.parse_args(argv)
    try:
        report = render(compare(ns.release, ns.master))
    except ToolError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    if ns.write:
        ns.write.write_text(report, encoding="utf-8")
        print(f"compare: wrote {ns.write}")
        return 0
    if ns.check:
        stored = ns.check.read_text(encoding="utf-8") if ns.check.is_file() else ""
        if stored != report:
            print(f"compare: {ns.check} is not the current comparison of {ns.release} and {ns.master}; regenerate "
                  f"it with `python ci/compare_series.py --write {ns.check}`", file=sys.stderr)
            return 1
        print(f"compare: {ns.check} is current")
        return 0
    print(report, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
