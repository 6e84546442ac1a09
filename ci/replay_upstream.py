"""Upstream replay check: apply the series onto upstream Lightning's git history and compare upstream's own tests.

The series targets the released ``lightning`` sdist; upstream reviewers apply it to a git checkout. For each ref (by
default the release tag of the pinned base, or the newest earlier tag of that minor release when the checkout lacks
it, and ``master``) this check:

1. clones the checkout into a temporary directory (``git clone --shared``: the checkout itself is never written);
2. runs upstream's own tests for the touched test paths on the ref (the directories that hold the series' test files,
   plus ``test_<module>.py`` for each source module the series changes, where upstream has one);
3. applies the series patch by patch with ``git am``, reporting each as ``clean`` (applies as is, offsets allowed),
   ``3-way`` (needed ``git am -3``) or ``CONFLICT`` (then skipped, so the later patches are still tried);
4. runs the same tests again and reports every upstream test whose outcome changed, and how the series' own new
   tests fare in upstream's test environment;
5. with ``--xpus N``, runs the XPU cases of those tests on N emulated XPUs (``LIGHTNING_XPU_EMULATOR=N``, the
   emulator installed in this Python): the XPU cases the series adds to upstream's own tests, reported apart from
   the series' own XPU tests, with each standalone test in a process of its own as upstream's CI runs them.

    LIGHTNING_UPSTREAM_CHECKOUT=~/src/pytorch-lightning python ci/replay_upstream.py [--ref 2.6.5 --ref master]

Without a checkout it prints why it is skipped and exits 0 (CI has no access to GitHub). Exit status 1 when a patch
conflicts, an upstream test that passed before the series fails after it or (``--xpus``) an XPU case fails; 2 on
bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tooling reads this checkout's series

from ci.bisect_series import base_tree  # noqa: E402
from ci.junit import Case, read_cases, summary  # noqa: E402
from lightning_xpu._git import run_git  # noqa: E402
from lightning_xpu.apply import describe_failure  # noqa: E402
from lightning_xpu.base import load_base  # noqa: E402
from lightning_xpu.errors import ToolError  # noqa: E402
from lightning_xpu.port import seed_series_blobs  # noqa: E402
from lightning_xpu.series import Patch, Series, find_series_dir, load_series  # noqa: E402
from lightning_xpu.upstream import is_upstream_series, load_upstream_base, missing_blobs  # noqa: E402
from tests.series.run import run_standalone  # noqa: E402

ENV_VAR = "LIGHTNING_UPSTREAM_CHECKOUT"
SKIP_MESSAGE = (
    f"replay check skipped: {ENV_VAR} is not set. Point it at a git checkout of "
    "https://github.com/Lightning-AI/pytorch-lightning (a bare mirror is fine) to replay the series onto upstream's "
    "history; this CI has no access to GitHub."
)
# committer identity for the temporary clone's commits; the user's git config is not read
_IDENT = {"GIT_COMMITTER_NAME": "lightning-xpu replay", "GIT_COMMITTER_EMAIL": "replay@lightning-xpu.invalid",
          "GIT_AUTHOR_NAME": "lightning-xpu replay", "GIT_AUTHOR_EMAIL": "replay@lightning-xpu.invalid",
          "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
_PACKAGES = {"src/lightning/fabric/": "tests_fabric", "src/lightning/pytorch/": "tests_pytorch"}
_TIER_VARIABLES = ("LIGHTNING_XPU_EMULATOR", "RUN_ONLY_XPU_TESTS", "RUN_ONLY_CUDA_TESTS", "PL_RUN_STANDALONE_TESTS")
CHANGELOG = "CHANGELOG.md"
_OFFSET = re.compile(r"Hunk #\d+ succeeded at \d+ \(offset (-?\d+) lines?\)")
REGRESSIONS = {("passed", "failed"), ("passed", "error"), ("skipped", "failed"), ("skipped", "error"),
               ("passed", "missing"), ("skipped", "missing")}


@dataclass
class PatchOutcome:
    patch: str
    result: str  # clean | 3-way | CONFLICT
    detail: str = ""
    changelog_only: bool = False  # the conflict is in CHANGELOG.md only; the code applied and was kept


@dataclass
class RefReport:
    ref: str
    commit: str
    note: str = ""
    series: str = ""  # the series directory replayed onto this ref
    patches: list[PatchOutcome] = field(default_factory=list)
    test_paths: list[str] = field(default_factory=list)
    before: str = ""
    after: str = ""
    changed: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)  # regressions that passed when run again alone
    # regressions in upstream test files that the master variant edits: the release series cannot carry those edits
    edited: list[str] = field(default_factory=list)
    series_tests: str = ""
    series_failures: list[str] = field(default_factory=list)
    series_failure_reasons: dict[str, int] = field(default_factory=dict)  # error message -> how many tests
    xpus: int = 0  # emulated XPUs the XPU cases ran on; 0: not run
    xpu_upstream: str = ""  # XPU cases of upstream's own tests (a parameter the series adds)
    xpu_series: str = ""  # the series' own XPU tests
    xpu_failures: list[str] = field(default_factory=list)

    @property
    def conflicts(self) -> int:
        return sum(p.result == "CONFLICT" for p in self.patches)


def git(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_git(args, cwd, env=_IDENT, check=check)


def resolve(checkout: Path, ref: str) -> str | None:
    """The commit ``ref`` names in ``checkout`` (tags, local and remote-tracking branches), or None."""
    for candidate in (ref, f"origin/{ref}", f"refs/tags/{ref}"):
        proc = git(["rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"], checkout, check=False)
        if proc.returncode == 0:
            return proc.stdout.strip()
    return None


def default_refs(checkout: Path, version: str) -> list[tuple[str, str]]:
    """``[(ref, note)]``: the release tag of the base (or the newest earlier tag of its minor release) and master."""
    refs: list[tuple[str, str]] = []
    if resolve(checkout, version):
        refs.append((version, ""))
    else:
        major_minor = version.rsplit(".", 1)[0]
        tags = git(["tag", "--list", f"{major_minor}.*"], checkout).stdout.split()
        ours = tuple(int(x) for x in version.split("."))
        older = [t for t in tags if re.fullmatch(r"\d+\.\d+\.\d+", t) and tuple(map(int, t.split("."))) < ours]
        if older:
            tag = max(older, key=lambda t: tuple(map(int, t.split("."))))
            refs.append((tag, f"tag {version} is not in this checkout; using {tag}, its newest earlier release tag"))
    for branch in ("master", "main"):
        if resolve(checkout, branch):
            refs.append((branch, ""))
            break
    return refs


def test_paths(tree: Path, series: Series, scope: str) -> list[str]:
    """Upstream test paths (relative to ``tree/tests``) that the series touches, that exist in ``tree``.

    ``dirs``: the directories holding the series' test files; ``files``: only the test files the series touches (and
    the upstream namesakes of its ``test_*_xpu.py`` files). Both add ``test_<module>.py`` of each changed module.
    """
    paths: dict[str, None] = {}
    for rel in series.files:
        if rel.startswith("tests/") and rel.endswith(".py") and scope == "files":
            name = Path(rel).name
            if name.startswith("test_"):
                paths[rel[len("tests/"):]] = None
                if Path(rel).stem.endswith("_xpu"):
                    paths[str(Path(rel[len("tests/"):]).with_name(Path(rel).stem[: -len("_xpu")] + ".py"))] = None
        elif rel.startswith("tests/") and rel.endswith(".py"):
            directory = Path(rel).parent.relative_to("tests")
            if str(directory) in _PACKAGES.values():  # a suite's root stands for its top-level files, not the suite
                paths.update(dict.fromkeys(str(p.relative_to(tree / "tests"))
                                           for p in sorted((tree / "tests" / directory).glob("test_*.py"))))
            else:
                paths[str(directory)] = None
        for prefix, suite in _PACKAGES.items():
            if rel.startswith(prefix) and rel.endswith(".py"):
                module = Path(rel[len(prefix):])
                candidate = Path(suite) / module.parent / f"test_{module.stem}.py"
                paths[str(candidate)] = None
    return _outermost([p for p in paths if (tree / "tests" / p).exists()])


def _outermost(paths: list[str]) -> list[str]:
    """Drop repeated paths and those that another path in the list (a directory) already covers."""
    paths = list(dict.fromkeys(paths))
    return [p for p in paths if not any(p != d and p.startswith(d + "/") for d in paths)]


def _test_env(tree: Path, tier: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the test-tier variables (but ``tier``'s), importing ``tree/src``."""
    env = {k: v for k, v in os.environ.items() if k not in _TIER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "src"), env.get("PYTHONPATH")]))
    return {**env, **(tier or {})}


def run_upstream_tests(tree: Path, paths: list[str], workers: int, junit: Path, timeout: int,
                       tier: dict[str, str] | None = None) -> list[Case]:
    """Run upstream's tests at ``paths`` the way its CPU CI does (from ``tests/``, importing ``src/``); ``tier``: the
    variables of a GPU tier (``RUN_ONLY_XPU_TESTS=1``, ...)."""
    if not paths:
        return []
    env = _test_env(tree, tier)
    # a module that cannot be imported (a missing optional dependency) is reported as an error, not a stop
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--color=no", f"--junitxml={junit}",
           "--continue-on-collection-errors", *(["-n", str(workers)] if workers else []), *paths]
    try:
        proc = subprocess.run(cmd, cwd=tree / "tests", env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolError(f"upstream's tests in {', '.join(paths)} ran longer than {timeout}s; "
                        "narrow them with --tests or raise --timeout") from None
    cases = read_cases(junit)
    if not cases and proc.returncode not in (0, 5):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise ToolError(f"pytest could not run upstream's tests (exit {proc.returncode}):\n{tail}")
    return cases


def run_xpu_cases(tree: Path, paths: list[str], xpus: int, workers: int, junit: Path, timeout: int) -> list[Case]:
    """The XPU cases at ``paths`` on ``xpus`` emulated XPUs: one pytest run, then each standalone test in a process
    of its own (its JUnit files beside ``junit``)."""
    tier = {"LIGHTNING_XPU_EMULATOR": str(xpus), "RUN_ONLY_XPU_TESTS": "1"}
    cases = [c for c in run_upstream_tests(tree, paths, workers, junit, timeout, tier)
             if "Standalone execution" not in c.message]
    standalone = junit.with_name(f"{junit.stem}-standalone.xml")
    with contextlib.redirect_stdout(sys.stderr):  # each test's output; the report goes to stdout
        run_standalone(tree / "tests", paths, [*paths, f"--junitxml={standalone}"], _test_env(tree, tier),
                       parallel=max(workers, 1))
    for path in sorted(junit.parent.glob(f"{standalone.stem}.standalone-*.xml")):
        cases += read_cases(path)
    # the standalone collection also holds the CUDA cases of a test the series parametrised: not XPU cases
    return [c for c in cases if not _OTHER_DEVICE.intersection(c.id.partition("[")[2].rstrip("]").split("-"))]


_OTHER_DEVICE = {"gpu", "cuda", "mps"}


def split_xpu_cases(before: list[Case], cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """``(upstream's, the series')``: the XPU cases of tests upstream had before the series (a parameter the series
    added to upstream's test), and those of the series' own tests."""
    upstream = {_test_of(c) for c in before}
    ours = [c for c in cases if _test_of(c) not in upstream]
    return [c for c in cases if _test_of(c) in upstream], ours


def _test_of(case: Case) -> str:
    """The test a case belongs to, whichever rootdir pytest had: upstream's (the checkout, ``tests.tests_fabric.x``)
    or the standalone runner's (``tests/``, ``tests_fabric.x``)."""
    return case.id.split("[", 1)[0].removeprefix("tests.")


def drop_missing_blobs(tree: Path) -> list[str]:
    """Remove from the index the files whose blobs the checkout lacks, so that ``git am`` can write trees.

    Mirrors that leave out their largest files (images under docs/) still list them in every tree; such a file is
    outside what the series and the tests touch, and dropping it from the temporary clone's index changes neither.
    """
    paths = missing_blobs(tree, "HEAD")
    if paths:
        git(["update-index", "--force-remove", "--", *paths], tree)
        git(["commit", "--quiet", "--no-verify", "-m", "replay: leave out files missing from this checkout"], tree)
    return paths


def _abort(tree: Path) -> None:
    git(["am", "--abort"], tree, check=False)
    git_dir = Path(git(["rev-parse", "--absolute-git-dir"], tree).stdout.strip())
    if (git_dir / "rebase-apply").exists():
        raise ToolError(f"`git am --abort` could not clean up the replay clone {tree}")


def apply_patch(tree: Path, patch: Patch) -> PatchOutcome:
    """Apply one patch as a commit; classify it, and skip it when it conflicts.

    Upstream's CHANGELOG.md files change with every merged PR, so a conflict there says little about the code: a
    patch that conflicts is tried again without its CHANGELOG.md hunks, and if its code then applies, that code is
    kept (so the later patches are checked against it) and the conflict is reported as CHANGELOG-only.
    """
    outcome = _apply(tree, patch)
    if outcome.result != "CONFLICT":
        return outcome
    options = []
    if any(f.endswith(CHANGELOG) for f in patch.files):
        options = [f"--exclude=*{CHANGELOG}"]
        code = _apply(tree, patch, *options)
        if code.result != "CONFLICT":
            return PatchOutcome(patch.name, "CONFLICT", f"only in {CHANGELOG} ({outcome.detail}); the code applies "
                                f"{code.result}" + (f", {code.detail}" if code.detail else ""), changelog_only=True)
        outcome = PatchOutcome(patch.name, "CONFLICT", f"{code.detail}; {CHANGELOG} conflicts too")
    outcome.detail += _keep_what_applies(tree, patch, *options)
    return outcome


def _keep_what_applies(tree: Path, patch: Patch, *options: str) -> str:
    """Commit the hunks of a conflicting patch that do apply, so that the later patches are checked against them."""
    git(["apply", "--reject", "--whitespace=nowarn", *options, str(patch.path)], tree, check=False)
    rejected = sorted(str(p.relative_to(tree))[: -len(".rej")] for p in tree.rglob("*.rej"))
    for path in rejected:
        (tree / f"{path}.rej").unlink()
    git(["add", "-A"], tree)
    if git(["diff", "--cached", "--quiet"], tree, check=False).returncode != 0:
        git(["commit", "--quiet", "--no-verify", "-m", f"replay: the hunks of {patch.name} that apply"], tree)
        return f"; kept its other hunks, rejected: {', '.join(rejected)}"
    return "; none of its hunks apply"


def _apply(tree: Path, patch: Patch, *options: str) -> PatchOutcome:
    check = git(["apply", "--check", "--verbose", *options, str(patch.path)], tree, check=False)
    if check.returncode == 0 and git(["am", "--quiet", *options, str(patch.path)], tree, check=False).returncode == 0:
        offsets = _OFFSET.findall(check.stderr + check.stdout)
        return PatchOutcome(patch.name, "clean", f"{len(offsets)} hunk(s) at an offset" if offsets else "")
    _abort(tree)
    proc = git(["am", "-3", "--quiet", *options, str(patch.path)], tree, check=False)
    if proc.returncode == 0:
        return PatchOutcome(patch.name, "3-way")
    conflicted = git(["diff", "--name-only", "--diff-filter=U"], tree, check=False).stdout.split()
    detail = f"merge conflict in {', '.join(conflicted)}" if conflicted else describe_failure(
        patch, proc.stderr + proc.stdout).split(": ", 1)[-1]
    git(["am", "--skip"], tree, check=False)
    _abort(tree)
    return PatchOutcome(patch.name, "CONFLICT", detail)


def compare(before: list[Case], after: list[Case], series: Series) -> tuple[list[str], list[Case], list[Case]]:
    """Changed outcomes of upstream's tests, the regressions among them, and the series' own test cases."""
    old = {c.id: c for c in before}
    new = {c.id: c for c in after}
    changed, regressions = [], []
    for test_id, case in old.items():
        now = new.get(test_id) or _renamed(test_id, old, after) or Case(test_id, "missing")
        if now.outcome != case.outcome:
            renamed = f" as {now.id.split('::', 1)[1]}" if now.id != test_id else ""
            changed.append(f"{test_id}: {case.outcome} -> {now.outcome}{renamed}"
                           + (f" ({now.message})" if now.message else ""))
            if (case.outcome, now.outcome) in REGRESSIONS:
                regressions.append(now)
    modules = _test_modules(series.files)
    added = [c for c in after if c.id not in old and _in_modules(_module(c.id), modules)]
    return changed, regressions, added


_OUTCOME_WEIGHT = {"error": 0, "failed": 1, "passed": 2, "skipped": 3}


def _renamed(test_id: str, old: dict[str, Case], after: list[Case]) -> Case | None:
    """The case that ``test_id`` became when the series parametrised its test (an accelerator parameter gives
    ``test_x`` the ids ``test_x[gpu]`` and ``test_x[xpu]``, ``test_x[16-mixed]`` becomes ``test_x[cuda-16-mixed]``):
    of the function's new cases that are not XPU cases, the worst outcome; None when the function has none."""
    function = test_id.split("[", 1)[0]
    successors = [c for c in after if c.id not in old and c.id.split("[", 1)[0] == function
                  and "xpu" not in c.id.partition("[")[2].lower()]
    return min(successors, key=lambda c: _OUTCOME_WEIGHT.get(c.outcome, 0), default=None)


def _test_modules(files: tuple[str, ...]) -> tuple[str, ...]:
    """Dotted modules, relative to ``tests/``, of the Python files under ``tests/`` among ``files``."""
    return tuple(f[len("tests/"):-len(".py")].replace("/", ".") for f in files
                 if f.startswith("tests/") and f.endswith(".py"))


def _display(directory: Path) -> str:
    try:
        return str(directory.relative_to(REPO))
    except ValueError:
        return str(directory)


def _module(test_id: str) -> str:
    """The dotted module (and class) of a JUnit id, relative to ``tests/`` like the series' file paths."""
    return test_id.split("::", 1)[0].removeprefix("tests.")


def _in_modules(classname: str, modules: tuple[str, ...]) -> bool:
    return any(classname == m or classname.startswith(m + ".") for m in modules)


def node_id(tests_dir: Path, case: Case) -> str | None:
    """``tests_fabric.x.test_y.TestZ::test_w[1]`` -> ``tests_fabric/x/test_y.py::TestZ::test_w[1]``."""
    parts, name = _module(case.id).split("."), case.id.split("::", 1)[1]
    for i in range(len(parts), 0, -1):
        path = Path(*parts[:i]).with_suffix(".py")
        if (tests_dir / path).is_file():
            return "::".join([str(path), *parts[i:], name])
    return None


def reproduced(tree: Path, cases: list[Case], junit: Path, timeout: int) -> set[str]:
    """Run the regressed tests again, alone and in one process: which fail again (the rest are flaky)."""
    nodes = {node: case.id for case in cases if (node := node_id(tree / "tests", case))}
    if not nodes:
        return {c.id for c in cases}
    rerun = {c.id: c for c in run_upstream_tests(tree, list(nodes), 0, junit, timeout)}
    failing = {c.id for c in cases if c.id not in nodes.values()}  # no node id: keep it as a regression
    return failing | {c.id for c in cases if c.id in rerun and rerun[c.id].outcome in ("failed", "error")}


def replay_ref(checkout: Path, clone: Path, ref: str, note: str, series: Series, ns: argparse.Namespace,
               scratch: Path, edited_upstream_files: tuple[str, ...] = ()) -> RefReport:
    """Replay ``series`` onto ``ref``. A regression in ``edited_upstream_files`` (upstream test files the master
    variant edits) is reported as such rather than counted."""
    sha = resolve(checkout, ref)
    if sha is None:
        raise ToolError(f"{ref!r} is not a commit, tag or branch in {checkout}")
    report = RefReport(ref, sha[:12], note, _display(series.directory))
    # mirrors may lack large blobs (images under docs/): keep those files out of the work tree
    patterns = ["/*", "!/*/", *(f"/{d}/" for d in ns.sparse), *(f"!/{path}" for path in missing_blobs(clone, sha))]
    git(["sparse-checkout", "set", "--no-cone", *patterns], clone)
    git(["checkout", "--quiet", "--force", "--detach", sha], clone)
    git(["clean", "-fdxq"], clone)
    if dropped := drop_missing_blobs(clone):
        report.note = "; ".join(filter(None, [report.note, f"{len(dropped)} file(s) whose contents this checkout "
                                              f"lacks were left out of the replay (e.g. {dropped[0]})"]))
    report.test_paths = [] if ns.no_tests else (ns.tests or test_paths(clone, series, ns.scope))
    safe = re.sub(r"\W", "_", ref)
    before = run_upstream_tests(clone, report.test_paths, ns.workers, scratch / f"{safe}-before.xml", ns.timeout)
    report.before = summary(before) if report.test_paths else "not run"
    for patch in series.patches:
        report.patches.append(apply_patch(clone, patch))
    code_conflicts = [p for p in report.patches if p.result == "CONFLICT" and not p.changelog_only]
    if report.test_paths and code_conflicts:
        # a half-applied patch (a call kept, its definition rejected) breaks tests the series does not break
        report.after = (f"not run: {len(code_conflicts)} patch(es) conflict in code, so this tree is not the series; "
                        "rebase them onto this ref first")
    elif report.test_paths:
        # the series may add test files in directories upstream does not have yet
        paths = report.test_paths if ns.tests else _outermost([*report.test_paths,
                                                                *test_paths(clone, series, ns.scope)])
        after = run_upstream_tests(clone, paths, ns.workers, scratch / f"{safe}-after.xml", ns.timeout)
        report.after = summary(after)
        report.changed, regressed, added = compare(before, after, series)
        confirmed = reproduced(clone, regressed, scratch / f"{safe}-rerun.xml", ns.timeout) if regressed else set()
        edited = {c.id for c in regressed if _in_modules(_module(c.id), _test_modules(edited_upstream_files))}
        report.edited = [line for line in report.changed if line.split(": ", 1)[0] in confirmed & edited]
        confirmed -= edited
        report.regressions = [line for line in report.changed if line.split(": ", 1)[0] in confirmed]
        report.flaky = [line for line in report.changed if line.split(": ", 1)[0] in {c.id for c in regressed}
                        and line.split(": ", 1)[0] not in confirmed | edited]
        report.series_tests = summary(added)
        broken = [c for c in added if c.outcome in ("failed", "error")]
        report.series_failures = [f"{c.id}: {c.message}" for c in broken]
        report.series_failure_reasons = dict(Counter(c.message for c in broken).most_common())
        if ns.xpus:
            report.xpus = ns.xpus
            xpu = run_xpu_cases(clone, paths, ns.xpus, ns.workers, scratch / f"{safe}-xpu.xml", ns.timeout)
            upstream, ours = split_xpu_cases(before, xpu)
            report.xpu_upstream, report.xpu_series = summary(upstream), summary(ours)
            report.xpu_failures = [f"{c.id}: {c.outcome} ({c.message})" for c in xpu
                                   if c.outcome in ("failed", "error")]
    return report


def print_report(report: RefReport) -> None:
    print(f"\n== {report.ref} ({report.commit}) ==")
    print(f"   series: {report.series}")
    if report.note:
        print(f"   note: {report.note}")
    width = max(len(p.patch) for p in report.patches) if report.patches else 0
    for outcome in report.patches:
        detail = f"  {outcome.detail}" if outcome.detail else ""
        print(f"   {outcome.patch:<{width}}  {outcome.result}{detail}")
    counts = {r: sum(p.result == r for p in report.patches) for r in ("clean", "3-way", "CONFLICT")}
    changelog = sum(p.changelog_only for p in report.patches)
    print("   patches: " + ", ".join(f"{n} {r}" for r, n in counts.items())
          + (f" ({changelog} of them only in {CHANGELOG})" if changelog else ""))
    if not report.test_paths:
        print("   upstream tests: not run")
        return
    print(f"   upstream tests in {', '.join(report.test_paths)}")
    print(f"     before the series: {report.before}")
    print(f"     after the series:  {report.after}")
    if report.after.startswith("not run"):
        return
    print(f"     upstream tests whose outcome changed: {len(report.changed)}")
    for line in report.changed:
        tag = ("REGRESSION " if line in report.regressions else "flaky: passes alone " if line in report.flaky
               else "edited by the master variant: " if line in report.edited else "")
        print(f"       {tag}{line}")
    print(f"     the series' own tests in upstream's environment: {report.series_tests}")
    reasons = list(report.series_failure_reasons.items())
    for reason, n in reasons[:15]:
        print(f"       {n} x {reason}")
    if len(reasons) > 15:
        print(f"       ... and {len(reasons) - 15} more reasons")
    if report.xpus:
        print(f"     XPU cases on {report.xpus} emulated XPUs, of upstream's tests: {report.xpu_upstream}")
        print(f"     XPU cases on {report.xpus} emulated XPUs, of the series' own tests: {report.xpu_series}")
        for line in report.xpu_failures:
            print(f"       {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=os.environ.get(ENV_VAR) or None,
                        help=f"upstream git checkout (default: ${ENV_VAR})")
    parser.add_argument("--ref", action="append", dest="refs", help="ref to replay onto; repeatable "
                        "(default: the base's release tag and master)")
    parser.add_argument("--series", type=Path, help="series directory (default: this checkout's patches/)")
    parser.add_argument("--master-series", type=Path, help="the master variant, replayed onto refs that contain its "
                        "base commit (default: SERIES/master when it exists)")
    parser.add_argument("--tests", nargs="+", help="upstream test paths relative to tests/ (default: derived)")
    parser.add_argument("--no-tests", action="store_true", help="only report how the patches apply")
    parser.add_argument("--scope", choices=("dirs", "files"), default="dirs",
                        help="upstream tests to compare: the directories holding the series' test files (default), "
                        "or only the test files the series touches; both add test_<module>.py of changed modules")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers; 0 runs in-process")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per upstream test run")
    parser.add_argument("--base-tree", type=Path, help="the unpacked base the series was made against "
                        "(default: the pinned sdist, downloaded once)")
    parser.add_argument("--xpus", type=int, default=0, metavar="N", help="after the series, also run the XPU cases "
                        "of the tests on N emulated XPUs (needs the emulator installed and a CPU build of torch)")
    parser.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    ns = parser.parse_args(argv)

    if ns.checkout is None:
        print(SKIP_MESSAGE)
        return 0
    checkout = Path(ns.checkout).expanduser().resolve()
    try:
        if git(["rev-parse", "--git-dir"], checkout, check=False).returncode != 0:
            raise ToolError(f"{checkout} is not a git checkout (from {ENV_VAR} or --checkout)")
        series = load_series(find_series_dir(ns.series.resolve() if ns.series else None))
        master = _master_series(ns.master_series, series)
        if ns.base_tree and not ns.base_tree.is_dir():
            raise ToolError(f"--base-tree {ns.base_tree} is not a directory")
        refs = [(r, "") for r in ns.refs] if ns.refs else default_refs(checkout, load_base(series.directory).version)
        if not refs:
            raise ToolError(f"{checkout} has neither a release tag of the base nor master/main; pass --ref")
        print(f"replay: {len(series.patches)} patches from {series.directory} onto {checkout} "
              f"at {', '.join(r for r, _ in refs)}", flush=True)
        reports = []
        with tempfile.TemporaryDirectory(prefix="lightning-xpu-replay-") as tmp:
            clone, started = Path(tmp) / "upstream", time.monotonic()
            git(["clone", "--quiet", "--shared", "--no-checkout", str(checkout), str(clone)], Path(tmp))
            # a sparse checkout skips notebooks and what the series does not touch: faster
            ns.sparse = sorted(_sparse_dirs(series) | (_sparse_dirs(master) if master else set()))
            try:
                base = ns.base_tree.resolve() if ns.base_tree else base_tree(series.directory)
                seed_series_blobs(clone, series, base)
            except ToolError as err:
                print(f"replay: the series' own file versions are not available ({err}); a patch that needs a 3-way "
                      "merge will show as a conflict", flush=True)
            edited = tuple(f for f in master.files if f not in series.files) if master else ()
            for ref, note in refs:
                if master and _contains(checkout, ref, load_upstream_base(master.directory).commit):
                    reports.append(replay_ref(checkout, clone, ref, note, master, ns, Path(tmp)))
                else:
                    reports.append(replay_ref(checkout, clone, ref, note, series, ns, Path(tmp), edited))
                print_report(reports[-1])
    except ToolError as err:
        print(f"replay: {err}", file=sys.stderr)
        return 2
    if ns.json:
        ns.json.write_text(json.dumps([asdict(r) for r in reports], indent=2) + "\n")
    conflicts = sum(r.conflicts for r in reports)
    regressions = sum(len(r.regressions) for r in reports)
    print(f"\nreplay: {conflicts} conflicting patch(es), {regressions} upstream test regression(s) "
          f"over {len(reports)} ref(s) in {time.monotonic() - started:.0f}s")
    xpu_failures = sum(len(r.xpu_failures) for r in reports)
    if any(r.xpus for r in reports):
        print(f"replay: {xpu_failures} XPU case(s) failed on emulated XPUs")
    return 1 if conflicts or regressions or xpu_failures else 0


def _master_series(option: Path | None, series: Series) -> Series | None:
    """The master variant: ``--master-series``, else ``SERIES/master`` when it holds a series based on upstream."""
    directory = option.resolve() if option else series.directory / "master"
    if option is None and not (directory / "series").is_file():
        return None
    if not is_upstream_series(find_series_dir(directory)):
        raise ToolError(f"{directory} is not a master variant: its base.toml names no upstream commit")
    return load_series(directory)


def _contains(checkout: Path, ref: str, commit: str) -> bool:
    """Whether ``ref`` is ``commit`` or descends from it (so the master variant made against it is the series)."""
    sha = resolve(checkout, ref)
    return sha is not None and git(["merge-base", "--is-ancestor", commit, sha], checkout, check=False).returncode == 0


def _sparse_dirs(series: Series) -> set[str]:
    return {"src", "tests", "requirements", ".actions"} | {f.split("/", 1)[0] for f in series.files if "/" in f}


if __name__ == "__main__":
    sys.exit(main())
