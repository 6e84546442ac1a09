"""Upstream's gates at every pull request of the series, so that a reviewer's first run finds nothing new.

The pull requests are the sections of ``patches/master/COVER.md`` (``## PR N: title (patches a-b)``, each with a
``**Needs:**`` line); the release series and the master variant share their numbering. For each pull request's end
(the series applied through its last patch) this runs, against the base:

1. upstream's pre-commit hooks for Python at their pinned versions, each in an environment of its own and with the
   base's ``pyproject.toml``: ``ruff check`` and ``ruff format`` on the whole tree, ``docformatter`` (its
   ``--in-place`` rewrite, checked) on the Python files and ``codespell`` on the text files the series touched;
2. mypy as upstream's ``code-checks.yml`` runs it (``requirements/typing.txt``: mypy 1.20.0, torch 2.9.1 installed
   without its NVIDIA libraries); errors compared by file and message;
3. upstream's CPU tests of the touched test files on torch 2.1.2 (``--torch`` another release), patched against
   unpatched;

and it applies each pull request onto exactly what its ``**Needs:**`` line names. Only what the series adds counts: a
finding the base already has is upstream's.

With ``$LIGHTNING_UPSTREAM_CHECKOUT`` (a clone of upstream with the master variant's base commit) the master variant
(``patches/master``) is checked on that commit, pins from its ``.pre-commit-config.yaml`` and
``requirements/typing.txt``, tests from upstream's own files. Without one (this project's CI) the release series
(``patches/``) is checked on the 2.6.6 sdists, which carry the same source changes: pins from
``ci/upstream_pins.toml``, tests from the series' own files (the sdists have no tests). The run says which.

    python ci/upstream_gates.py [--steps cover,needs,hooks,mypy,tests] [--torch 2.1.2] [--report FILE]
    python ci/upstream_gates.py --matrix        # the tests step on every torch of upstream's matrix, final series

Exit status: 0 when the series adds nothing, 1 when a gate finds something, 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tooling checks this checkout's series

from ci.bisect_series import base_tree  # noqa: E402
from ci.gates import hooks, pins, torch_tests, typecheck  # noqa: E402
from ci.gates.cover import PullRequest, parse_cover  # noqa: E402
from ci.gates.venvs import ensure_venv, executable  # noqa: E402
from ci.junit import Case, summary  # noqa: E402
from lightning_xpu import changelog_merge  # noqa: E402
from lightning_xpu.apply import PatchFailed, apply_to_tree  # noqa: E402
from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.series import Series, load_series  # noqa: E402
from lightning_xpu.upstream import CHECKOUT_VAR, export_tree, load_upstream_base, resolve_checkout  # noqa: E402

STEPS = ("cover", "needs", "hooks", "mypy", "tests")
HOOKS = ("ruff check", "ruff format", "docformatter", "codespell")
MATRIX_REPORT = REPO / "benchmarks" / "results" / "upstream-matrix.md"
_SEEN_BY_TESTS = ("src/", "tests/")


@dataclass
class EndReport:
    """What the gates found at one pull request's end."""

    pr: PullRequest
    findings: dict[str, list[str]] = field(default_factory=dict)  # gate -> findings
    notes: dict[str, str] = field(default_factory=dict)  # gate -> what ran (counts), or why it did not

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.findings.values())


@dataclass
class Context:
    """One run: the series, its base, the pull requests and where the tools live."""

    series: Series
    prs: list[PullRequest]
    base: Path
    upstream: bool  # True: the master variant on an upstream commit (its tests are upstream's own)
    venvs: Path
    scratch: Path
    workers: int
    pins: pins.Pins
    made: list[str] = field(default_factory=list)  # environments made in this run, with their cost
    tests_under: tuple[str, ...] = ()  # with a checkout: only upstream's test files under these folders of tests/

    def patches(self, prs: list[PullRequest]) -> Series:
        chosen = [p for pr in prs for p in self.series.patches[pr.first - 1:pr.last]]
        return Series(self.series.directory, tuple(chosen))

    def touched(self, pr: PullRequest) -> list[str]:
        """Every file the series touches up to ``pr``'s end."""
        return list(Series(self.series.directory, self.series.patches[:pr.last]).files)


def check_needs(ctx: Context) -> tuple[dict[int, str], list[int]]:
    """Apply each pull request onto the base plus exactly the pull requests its Needs line names: ``{PR: error}``, and
    the pull requests that applied on the sdists only with their CHANGELOG entries merged (:func:`_applies_merged`)."""
    failures, merged = {}, []
    for pr in ctx.prs:
        needed = [p for p in ctx.prs if p.number in pr.needs]
        try:
            apply_to_tree(ctx.patches([*needed, pr]), ctx.base, check=True)
        except PatchFailed as err:
            if not ctx.upstream and _applies_merged(ctx, needed, pr):
                merged.append(pr.number)
                continue
            onto = "the bare base" if not needed else "the base + " + ", ".join(f"PR {p.number}" for p in needed)
            failures[pr.number] = (f"PR {pr.number} does not apply onto {onto} (its Needs line: "
                                   f"\"{pr.needs_text}\"): {str(err).split('; ')[0]}")
    return failures, merged


def _applies_merged(ctx: Context, needed: list[PullRequest], pr: PullRequest) -> bool:
    """Whether ``pr`` applies onto the base plus ``needed`` with every hunk exact but those of the CHANGELOGs, whose
    entries are merged as upstream merges concurrent pull requests' (``lightning_xpu.changelog_merge``, into the same
    sections). The sdists' unreleased sections hold only a ``-`` placeholder, which a section's first entry replaces:
    two pull requests that each add the first entry of a section can't both apply exactly onto a bare sdist, as they
    do onto master, whose sections have entries."""
    earlier = [p for p in ctx.prs if p.number < pr.number]
    own = ctx.patches([pr])
    with tempfile.TemporaryDirectory(prefix="upstream-gates-needs-") as tmp:
        trees = {name: Path(tmp) / name for name in ("onto", "before", "after")}
        try:
            for name, prs in (("onto", needed), ("before", earlier), ("after", [*earlier, pr])):
                shutil.copytree(ctx.base, trees[name], symlinks=True)
                apply_to_tree(ctx.patches(prs), trees[name])
        except PatchFailed:
            return False
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": tmp}
        for patch in own.patches:
            proc = subprocess.run(["git", "apply", "--exclude=src/lightning/*/CHANGELOG.md", str(patch.path)],
                                  cwd=trees["onto"], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                return False
        for path in (f for f in own.files if f.endswith("CHANGELOG.md")):
            base, ours, theirs = ((trees[n] / path).read_text() for n in ("before", "onto", "after"))
            try:
                changelog_merge.merge(base, ours, theirs)
            except changelog_merge.Unmergeable:
                return False
    return True


def hook_tools(ctx: Context, from_path: bool, log) -> dict[str, str]:
    """Each hook's executable: in an environment of its own at upstream's pin, or (``from_path``) the one on PATH."""
    if not from_path:
        return {name: executable(ensure_venv(ctx.venvs, f"{name}-{hook.version}", [hook.requirements], ctx.made),
                                 name) for name, hook in ctx.pins.hooks.items()}
    tools = {}
    for name in ctx.pins.hooks:
        found = shutil.which(name)
        if found is None:
            raise ToolError(f"--tools-from-path: no `{name}` on PATH")
        tools[name] = found
        version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout.strip()
        log(f"hooks: {name} from PATH ({version or 'version unknown'}), not upstream's pin "
            f"{ctx.pins.hooks[name].version}")
    return tools


def run_hooks(tools: dict[str, str], tree: Path, files: list[str], upstream: bool) -> dict[str, list[hooks.Record]]:
    with nullcontext() if upstream else hooks.upstream_test_packages(tree):
        return {
            "ruff check": hooks.ruff_check(tools["ruff"], tree),
            "ruff format": hooks.ruff_format(tools["ruff"], tree),
            "docformatter": hooks.docformatter(tools["docformatter"], tree, files),
            "codespell": hooks.codespell(tools["codespell"], tree, files),
        }


def test_files(ctx: Context, tree: Path, files: list[str]) -> list[str]:
    """The upstream test files among ``files`` that exist in ``tree`` (and lie under ``ctx.tests_under``, where
    given), relative to ``tree/tests``."""
    return sorted(f[len("tests/"):] for f in files if f.startswith("tests/") and Path(f).name.startswith("test_")
                  and f.endswith(".py") and (tree / f).is_file()
                  and (not ctx.tests_under or f[len("tests/"):].startswith(ctx.tests_under)))


def run_tests(ctx: Context, python: Path, tree: Path, files: list[str], name: str) -> list[Case]:
    junit = ctx.scratch / f"junit-{name}.xml"
    if ctx.upstream:
        return torch_tests.run_upstream_files(python, tree, files, junit, ctx.workers)
    return torch_tests.run_series_tests(python, tree, junit, ctx.workers)


def walk(ctx: Context, name: str, reports: dict[int, EndReport], include_base: bool = False
         ) -> Iterator[tuple[PullRequest | None, Path, bool]]:
    """Copy the base to ``scratch/name`` and yield ``(pr, tree, retest)`` at each pull request's end (first
    ``(None, tree, True)`` for the unpatched tree, with ``include_base``); ``retest``: the pull request changes
    something under ``src/`` or ``tests/``. A pull request that does not apply ends the walk, recorded in its
    report."""
    tree = ctx.scratch / name
    shutil.copytree(ctx.base, tree, symlinks=True)
    if include_base:
        yield None, tree, True
    for pr in ctx.prs:
        try:
            apply_to_tree(ctx.patches([pr]), tree)
        except PatchFailed as err:
            reports[pr.number].findings["apply"] = [f"the series does not apply at {pr.label}: {err}"]
            return
        yield pr, tree, any(f.startswith(_SEEN_BY_TESTS) for p in ctx.patches([pr]).patches for f in p.files)
    shutil.rmtree(tree, ignore_errors=True)


def hooks_step(ctx: Context, reports: dict[int, EndReport], tools_from_path: bool, log) -> None:
    tools = hook_tools(ctx, tools_from_path, log)
    base = run_hooks(tools, ctx.base, list(ctx.series.files), ctx.upstream)
    for pr, tree, _ in walk(ctx, "tree-hooks", reports):
        assert pr is not None
        for name, records in run_hooks(tools, tree, ctx.touched(pr), ctx.upstream).items():
            reports[pr.number].findings[name] = hooks.new_records(base[name], records)
        log(f"hooks at the end of {pr.label}: " + ", ".join(
            f"{name} {len(reports[pr.number].findings[name])}" for name in HOOKS))


def mypy_step(ctx: Context, reports: dict[int, EndReport], prune: bool, log) -> None:
    reqs, left_out = typecheck.requirement_steps(ctx.base, ctx.pins.typing)
    python = ensure_venv(ctx.venvs, "mypy", reqs, ctx.made)
    version = typecheck.probe_torch(python, ctx.scratch / "probe")
    log(f"mypy: torch {version} without its NVIDIA libraries; a probe confirmed that mypy sees its types"
        + (f"; left out of Lightning's extras: {'; '.join(left_out)}" if left_out else ""))
    cache = ctx.scratch / "mypy-cache"
    base: list[typecheck.MypyError] = []
    previous: EndReport | None = None
    # the base is checked in the walk's own tree (before its first patch), so that every run shares one cache
    for pr, tree, retest in walk(ctx, "tree-mypy", reports, include_base=True):
        started = time.monotonic()
        if pr is None:
            base = typecheck.run_mypy(python, tree, cache)
            log(f"mypy on the base: {len(base)} error(s) ({time.monotonic() - started:.0f}s)")
            continue
        report = reports[pr.number]
        if retest or previous is None:
            errors = typecheck.run_mypy(python, tree, cache)
            report.findings["mypy"] = [str(e) for e in typecheck.new_errors(base, errors)]
            report.notes["mypy"] = f"{len(errors)} error(s) in all, the base {len(base)}"
        else:
            report.findings["mypy"] = list(previous.findings.get("mypy", []))
            report.notes["mypy"] = f"as at PR {previous.pr.number}'s end: {pr.label} changes no source"
        previous = report
        log(f"mypy at the end of {pr.label}: {len(report.findings['mypy'])} new ({time.monotonic() - started:.0f}s)")
    if prune:
        shutil.rmtree(python.parent.parent, ignore_errors=True)


def tests_step(ctx: Context, reports: dict[int, EndReport], torch: str, prune: bool, only_last: bool, log) -> None:
    python = ensure_venv(ctx.venvs, f"tests-torch{torch}{'-upstream' if ctx.upstream else ''}",
                         torch_tests.venv_steps(torch, ctx.upstream), ctx.made)
    base_cases: list[Case] = []
    if ctx.upstream:
        started = time.monotonic()
        base_cases = run_tests(ctx, python, ctx.base, test_files(ctx, ctx.base, list(ctx.series.files)), "base")
        log(f"tests on torch {torch}, unpatched: {summary(base_cases)} ({time.monotonic() - started:.0f}s)")
    previous: EndReport | None = None
    for pr, tree, retest in walk(ctx, "tree-tests", reports):
        assert pr is not None
        report, started = reports[pr.number], time.monotonic()
        if only_last and pr is not ctx.prs[-1]:
            continue
        if not retest and previous is not None:
            report.findings["tests"] = list(previous.findings.get("tests", []))
            report.notes["tests"] = f"as at PR {previous.pr.number}'s end: no source or test changes"
        else:
            tests = test_files(ctx, tree, ctx.touched(pr))
            cases = run_tests(ctx, python, tree, tests, f"pr{pr.number}")
            before = torch_tests.in_files(base_cases, tests)
            unpatched = summary(before) if ctx.upstream else "none (the sdists have no tests)"
            where = f"{len(tests)} upstream test file(s)" if ctx.upstream else "the series' test files"
            report.findings["tests"] = torch_tests.findings(before, cases)
            report.notes["tests"] = f"torch {torch}, {where}: unpatched {unpatched}; patched {summary(cases)}"
        previous = report
        log(f"tests at the end of {pr.label}: {len(report.findings['tests'])} finding(s) [{report.notes['tests']}] "
            f"({time.monotonic() - started:.0f}s)")
    if prune:
        shutil.rmtree(python.parent.parent, ignore_errors=True)


def gate(ctx: Context, steps: set[str], torch: str, log, tools_from_path: bool = False,
         prune: bool = False, tests_at: str = "each") -> list[EndReport]:
    """Each chosen gate at every pull request's end against the base, one gate at a time (so that each tool's
    environment can go before the next is made: ``prune``)."""
    reports = {pr.number: EndReport(pr) for pr in ctx.prs}
    if "hooks" in steps:
        hooks_step(ctx, reports, tools_from_path, log)
    if "mypy" in steps:
        mypy_step(ctx, reports, prune, log)
    if "tests" in steps:
        tests_step(ctx, reports, torch, prune, tests_at == "last", log)
    for report in reports.values():
        log(format_end(report))
    return list(reports.values())


def format_end(report: EndReport) -> str:
    pr = report.pr
    lines = [f"== PR {pr.number} end, {pr.label}: {pr.title}: {report.count} finding(s)"]
    for name, found in report.findings.items():
        note = f" [{report.notes[name]}]" if name in report.notes else ""
        lines.append(f"   {name}: {len(found) if found else 'nothing new'}{note}")
        lines += [f"     {line}" for finding in found for line in finding.splitlines()]
    return "\n".join(lines)


def markdown(ctx: Context, mode: str, needs: dict[int, str] | None, stale: list[str], reports: list[EndReport],
             torch: str, merged: tuple[int, ...] = ()) -> str:
    out = ["# Upstream's gates at every pull request's end", "", mode, ""]
    if stale:
        out += ["## ci/upstream_pins.toml is stale", "", *(f"- {s}" for s in stale), ""]
    if needs is not None:
        out += ["## Needs lines", ""]
        out += [f"- PR {pr.number} (needs: {', '.join(f'PR {n}' for n in pr.needs) or 'nothing'}): "
                + (f"**does not apply**: {needs[pr.number]}" if pr.number in needs else "applies"
                   + (" (its CHANGELOG entries merged into the sdist's placeholder sections)"
                      if pr.number in merged else ""))
                for pr in ctx.prs]
        out.append("")
    for report in reports:
        pr = report.pr
        out += [f"## PR {pr.number} end ({pr.label.split('(')[1].rstrip(')')}): {pr.title}", ""]
        for name, found in report.findings.items():
            note = f" ({report.notes[name]})" if name in report.notes else ""
            title = f"tests on torch {torch}" if name == "tests" else name
            out.append(f"- **{title}**: {len(found) if found else 'nothing new'}{note}")
            if found:
                out.append("")
                out.append("  ```")
                out += [f"  {line}" for finding in found for line in finding.splitlines()]
                out.append("  ```")
        out.append("")
    return "\n".join(out)


def load_context(ns: argparse.Namespace, scratch: Path) -> tuple[Context, str]:
    """The series, base and pins of this run, and a sentence saying which mode it is in."""
    checkout = os.environ.get(CHECKOUT_VAR)
    upstream = bool(checkout) if ns.series is None else (ns.series / "base.toml").is_file() and \
        "upstream" in (ns.series / "base.toml").read_text()
    series_dir = ns.series or (REPO / "patches" / "master" if upstream else REPO / "patches")
    series = load_series(series_dir.resolve())
    prs = parse_cover(ns.cover, len(series.patches))
    if ns.base_tree:
        base = ns.base_tree.resolve()
        where = f"the base tree {base}"
    elif upstream:
        upstream_base = load_upstream_base(series.directory)
        base = scratch / "base"
        export_tree(resolve_checkout(None, upstream_base), upstream_base, base)
        where = f"upstream {upstream_base.ref} at {upstream_base.short} (${CHECKOUT_VAR})"
    else:
        base = base_tree(series.directory)
        where = "the lightning 2.6.6 sdist"
    recorded = pins.from_pin_file()
    ctx = Context(series, prs, base, upstream, ns.venvs.resolve(), scratch, ns.workers,
                  pins.from_base(base, recorded), tests_under=tuple(ns.tests_under))
    if upstream:
        mode = (f"Mode: the master variant ({series.directory}) on {where}; pins from {ctx.pins.source}; tests: "
                "upstream's own test files that the series touches.")
    else:
        mode = (f"Mode: the release series ({series.directory}) on {where}, which carries the same source changes; "
                f"pins from {ctx.pins.source}; tests: the series' own test files (the sdists have none of "
                f"upstream's). Upstream's own tests patched vs unpatched, its .pre-commit-config.yaml and "
                f"requirements/typing.txt need an upstream checkout: set ${CHECKOUT_VAR}.")
    return ctx, mode


def matrix(ctx: Context, versions: list[str], log) -> tuple[str, int]:
    """The tests step at the final pull request's end on each torch release: the markdown table of the results, and
    how many findings it holds."""
    last = ctx.prs[-1]
    tree = ctx.scratch / "matrix-tree"
    shutil.copytree(ctx.base, tree, symlinks=True)
    files_all = list(ctx.series.files)
    base_files = test_files(ctx, tree, files_all)
    base_copy = ctx.scratch / "matrix-base"
    shutil.copytree(tree, base_copy, symlinks=True)
    apply_to_tree(ctx.patches(ctx.prs), tree)
    rows = []
    for torch in versions:
        name = f"tests-torch{torch}{'-upstream' if ctx.upstream else ''}"
        started = time.monotonic()
        python = ensure_venv(ctx.venvs, name, torch_tests.venv_steps(torch, ctx.upstream), ctx.made)
        before = run_tests(ctx, python, base_copy, base_files, f"m{torch}-base") if ctx.upstream else []
        after = run_tests(ctx, python, tree, test_files(ctx, tree, files_all), f"m{torch}-end")
        found = torch_tests.findings(before, after)
        rows.append((torch, summary(before) if ctx.upstream else "(no tests)", summary(after), found))
        log(f"torch {torch}: unpatched {rows[-1][1]}; patched {rows[-1][2]}; {len(found)} finding(s) "
            f"({time.monotonic() - started:.0f}s)")
        for line in found:
            log(f"   {line}")
        shutil.rmtree(python.parent.parent, ignore_errors=True)  # one torch on disk at a time (several GB each)
    what = "upstream's own test files the series touches" if ctx.upstream else "the series' own test files"
    out = ["# Upstream's CPU tests on upstream's torch matrix, patched vs unpatched", "",
           f"`python ci/upstream_gates.py --matrix` at the end of PR {last.number} (the whole series), {what}, "
           f"Python {sys.version_info.major}.{sys.version_info.minor}, PyPI's builds of torch, CPU only.", "",
           "| torch | unpatched | patched | findings |", "|---|---|---|---|"]
    out += [f"| {t} | {b} | {a} | {len(f)} |" for t, b, a, f in rows]
    for torch, _, _, found in rows:
        if found:
            out += ["", f"## torch {torch}", "", "```", *found, "```"]
    return "\n".join(out) + "\n", sum(len(f) for *_, f in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", type=Path, help="series directory (default: patches/master with "
                        f"${CHECKOUT_VAR}, else patches/)")
    parser.add_argument("--cover", type=Path, default=REPO / "patches" / "master" / "COVER.md",
                        help="the cover letter whose `## PR N` sections are the pull requests")
    parser.add_argument("--base-tree", type=Path, help="an unpacked base tree (default: the sdist, or the checkout's "
                        "commit)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}")
    parser.add_argument("--torch", help="the torch release of the tests step (default: the oldest of upstream's "
                        "matrix, ci/upstream_pins.toml)")
    parser.add_argument("--tests-under", action="append", default=[], metavar="DIR", help="with a checkout: run only "
                        "upstream's touched test files under DIR of tests/ (e.g. tests_fabric); repeatable")
    parser.add_argument("--tests-at", choices=("each", "last"), default="each", help="run the tests step at each "
                        "pull request's end (default) or only at the series' end (CI: one run instead of six; a break "
                        "that a later pull request mends goes unseen)")
    parser.add_argument("--matrix", nargs="?", const="all", metavar="VERSIONS", help="run only the tests step, at "
                        "the series' end, on every torch of upstream's matrix (or the comma-separated VERSIONS), and "
                        f"write {MATRIX_REPORT.relative_to(REPO)} (or --matrix-out)")
    parser.add_argument("--matrix-out", type=Path, default=MATRIX_REPORT, help="where --matrix writes its table")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "lightning-xpu" / "gates",
                        help="where the tools' environments live (tox: inside its environment, pruned with it)")
    parser.add_argument("--tools-from-path", action="store_true", help="run the hooks found on PATH instead of "
                        "upstream's pins (this repository's tests of the gates, which install nothing)")
    parser.add_argument("--prune", action="store_true", default=os.environ.get("LIGHTNING_XPU_PRUNE_TOX_ENVS") == "1",
                        help="remove the mypy and test environments (GBs of torch) once their gate has run (default: "
                        "on where .ci/run sets LIGHTNING_XPU_PRUNE_TOX_ENVS=1)")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers for the tests step")
    parser.add_argument("--report", type=Path, help="also write the findings as markdown to this file")
    ns = parser.parse_args(argv)
    steps = {s.strip() for s in ns.steps.split(",") if s.strip()}
    if unknown := steps - set(STEPS):
        parser.error(f"unknown step(s) {sorted(unknown)}; choose from {', '.join(STEPS)}")

    started = time.monotonic()

    def log(line: str) -> None:
        print(line, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="lightning-xpu-gates-") as tmp:
            ctx, mode = load_context(ns, Path(tmp))
            log(f"upstream-gates: {len(ctx.series.patches)} patches as {len(ctx.prs)} pull requests "
                f"({', '.join(f'PR {p.number}: {p.first}-{p.last}' for p in ctx.prs)})")
            log(mode)
            torch = ns.torch or ctx.pins.torch_matrix[0]
            if ns.matrix:
                versions = list(ctx.pins.torch_matrix) if ns.matrix == "all" else ns.matrix.split(",")
                text, found = matrix(ctx, versions, log)
                ns.matrix_out.write_text(text)
                log(f"upstream-gates: wrote {ns.matrix_out}: {found} finding(s) over {len(versions)} torch "
                    f"release(s) ({time.monotonic() - started:.0f}s)")
                return 1 if found else 0
            stale = pins.stale_entries(ctx.pins, pins.from_pin_file()) if ctx.upstream else []
            for line in stale:
                log(f"STALE ci/upstream_pins.toml: {line}")
            needs, merged = check_needs(ctx) if "needs" in steps else (None, [])
            for error in (needs or {}).values():
                log(f"NEEDS: {error}")
            if needs is not None and not needs:
                log("needs: every pull request applies onto exactly what its Needs line names")
            if merged:
                log("needs: on the sdists' placeholder CHANGELOG sections, the entries of " +
                    ", ".join(f"PR {n}" for n in merged) + " merged as upstream merges them (every other hunk exact)")
            reports = []
            if steps - {"cover", "needs"}:
                reports = gate(ctx, steps, torch, log, ns.tools_from_path, ns.prune, ns.tests_at)
            for line in ctx.made:
                log(f"environment {line}")
            if ns.report:
                ns.report.write_text(markdown(ctx, mode, needs, stale, reports, torch, tuple(merged)))
    except (ToolError, PatchFailed) as err:
        print(f"upstream-gates: {err}", file=sys.stderr)
        return 2
    total = sum(r.count for r in reports) + len(needs or {}) + len(stale)
    log(f"upstream-gates: {total} finding(s) over {len(reports)} pull request end(s) "
        f"({time.monotonic() - started:.0f}s)")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
