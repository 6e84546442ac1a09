"""The XPU test matrix: every upstream test marked ``RunIf(min_cuda_gpus=...)`` and its XPU twin(s) or why it has none.

Upstream Lightning marks a few hundred tests as CUDA tests. ``ci/upstream_cuda_tests.txt`` lists them (one test
function per line, from the base's release tag and from master); ``ci/cuda_matrix.tsv`` gives each of them one row::

    UPSTREAM_TEST <TAB> TIER:TWIN [TIER:TWIN ...] <TAB> FORM <TAB> CASES [<TAB> MISSING]
                                                      the XPU twin(s) in the series' tests and their tier
    UPSTREAM_TEST <TAB> n/a:REASON                    it does not apply to XPU, for one of REASONS below
    UPSTREAM_TEST <TAB> todo                          it applies, but the series has no twin yet

A twin is a test id as the series' tests are laid out (``tests_fabric/...py::name``, optionally with ``[params]``).
FORM is how the master variant adds the twin to upstream's tests: ``parametrised`` (an XPU case of upstream's own
test) or ``copied`` (a test of its own). CASES is the number of cases the twins have (as collected from the patched
tree); where it is below the number of cases upstream runs on CUDA (``ci/upstream_cuda_tests.txt``'s second column),
MISSING names the cases the twins lack and why.
The tier is where the twin runs: ``mocked`` (no XPU needed), ``emulated`` (``RunIf(min_xpu_gpus=N)``), ``standalone``
(``RunIf(min_xpu_gpus=N, standalone=True)``, one process each) or ``real-hardware`` (an XPU test that only Intel
GPUs can run). ``tests/tooling/test_cuda_matrix.py`` checks the map against the list, the reasons against REASONS,
and that every named twin is collected from the patched tree with the tier it claims. After a tier has run, its JUnit
files show whether each twin that claims the tier passed there: ``--outcomes`` fails where one only skipped or did
not run (the tox environments of the mocked, emulated and standalone tiers call it).

    python ci/cuda_matrix.py --table                  print the README's count tables
    python ci/cuda_matrix.py --scan CHECKOUT [REF...] list the CUDA-marked tests of an upstream git checkout
    python ci/cuda_matrix.py --outcomes TIER JUNIT... the twins of TIER that did not pass in these JUnit files
                                                      (a directory stands for the *.xml files in it)
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from ci.junit import Case, read_cases  # noqa: E402

MAP = HERE / "cuda_matrix.tsv"
MASTER_SERIES = HERE.parent / "patches" / "master"
UPSTREAM = HERE / "upstream_cuda_tests.txt"

TIERS = ("mocked", "emulated", "standalone", "real-hardware")
FORMS = ("parametrised", "copied")
REASONS = {
    "deepspeed": "Scope decision, not an XPU limitation: DeepSpeed runs on Intel GPUs through its own accelerator "
    "abstraction, but Lightning's DeepSpeed strategies are wired to CUDA and the series does not port them; it refuses "
    "`strategy='deepspeed'` on XPU at construction, saying what to use (tested by the connector tests of the patch "
    "`fabric, pytorch: refuse CUDA-only strategies and precisions on other GPUs`).",
    "bitsandbytes": "Scope decision, not an XPU limitation: bitsandbytes' multi-backend releases have Intel GPU "
    "kernels, but Lightning's plugin is written against its CUDA layers and the series does not port it; it refuses "
    "the plugin on XPU at construction (the patch `fabric, pytorch: refuse CUDA-only strategies and precisions on "
    "other GPUs`).",
    "transformer-engine": "NVIDIA TransformerEngine is CUDA-only; the series rejects it on XPU at construction.",
    "tensorrt": "Torch-TensorRT compiles for NVIDIA GPUs only.",
    "cuda-api": "The test exercises a CUDA-only API with no XPU counterpart in PyTorch or Lightning: nvidia-smi, "
    "`torch.nn.DataParallel`'s scatter/gather (`strategy='dp'`, which the series refuses on XPU at construction, "
    "pointing to `strategy='ddp'`: the connector tests of the patch `fabric, pytorch: refuse CUDA-only strategies and "
    "precisions on other GPUs`), NCCL's PREMUL_SUM reduction (XCCL has none), CUDA graphs.",
    "old-torch": "Upstream runs the test, or expects it to pass, only on PyTorch older than the series' floor (torch "
    "2.8): `RunIf(max_torch=...)` or a strict xfail from 2.8 on. It checks nothing upstream with a PyTorch that runs "
    "Lightning on XPUs.",
    "benchmark": "A speed or memory parity benchmark, not a behaviour test; the project measures speed with "
    "benchmarks/ (bench_xpu_step.py, bench_cuda_parity.py), never with timed tests.",
    "master-only": "The test covers a feature upstream added on master after the 2.6.6 release that the series targets "
    "(fsspec URLs in ModelParallelStrategy checkpoints): the release series has no such code to test, and its twin "
    "is an XPU case of upstream's test in the master variant.",
}

# upstream areas for the README's counts: (suite, folder) or a keyword of the file name for the strategies
_STRATEGY_AREAS = (("deepspeed", "DeepSpeed"), ("fsdp", "FSDP"), ("model_parallel", "ModelParallel"),
                   ("ddp", "DDP"))


@dataclass(frozen=True)
class Twin:
    tier: str
    test_id: str

    @property
    def function_id(self) -> str:
        """``file::name`` without the parametrisation."""
        return self.test_id.split("[", 1)[0]


@dataclass(frozen=True)
class Row:
    upstream: str
    twins: tuple[Twin, ...] = ()
    reason: str | None = None
    line: int = 0
    form: str | None = None
    cases: int = 0
    missing: str | None = None

    @property
    def status(self) -> str:
        return "twin" if self.twins else "n/a" if self.reason else "todo"


class MatrixError(ValueError):
    """The map file is malformed."""


def read_upstream(path: Path = UPSTREAM) -> dict[str, int]:
    """Each upstream CUDA test and the number of its cases upstream runs on CUDA."""
    tests = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, cases = line.split("\t")
            tests[name.strip()] = int(cases)
    return tests


def read_map(path: Path = MAP) -> list[Row]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 2:
            raise MatrixError(f"{path.name}:{number}: expected tab-separated fields, got {len(fields)}")
        upstream, verdict = fields[0].strip(), fields[1].split()
        if verdict == ["todo"] or verdict[0].startswith("n/a:"):
            if len(fields) != 2:
                raise MatrixError(f"{path.name}:{number}: a row without twins has two fields, got {len(fields)}")
        elif len(fields) not in (4, 5) or not fields[3].strip().isdigit():
            raise MatrixError(f"{path.name}:{number}: a row with twins is UPSTREAM, TWINS, FORM, CASES [, MISSING]")
        if verdict == ["todo"]:
            rows.append(Row(upstream, line=number))
        elif len(verdict) == 1 and verdict[0].startswith("n/a:"):
            rows.append(Row(upstream, reason=verdict[0].removeprefix("n/a:"), line=number))
        else:
            twins = []
            for item in verdict:
                tier, sep, test_id = item.partition(":")
                if not sep or "::" not in test_id:
                    raise MatrixError(f"{path.name}:{number}: {item!r} is not TIER:FILE::TEST, n/a:REASON or todo")
                twins.append(Twin(tier, test_id))
            missing = fields[4].strip() if len(fields) == 5 else None
            rows.append(Row(upstream, twins=tuple(twins), line=number, form=fields[2].strip(),
                            cases=int(fields[3]), missing=missing or None))
    return rows


def area(upstream: str) -> str:
    path = upstream.split("::", 1)[0].removeprefix("tests/")
    parts = path.split("/")
    suite = {"tests_fabric": "Fabric", "tests_pytorch": "Trainer"}.get(parts[0], "parity")
    if suite == "parity":
        return "parity benchmarks"
    if parts[1] == "strategies":
        for keyword, name in _STRATEGY_AREAS:
            if keyword in parts[-1]:
                return f"{suite}: {name}"
        return f"{suite}: other strategies"
    folder = parts[1] if len(parts) > 2 else "top level"
    return f"{suite}: {folder}"


def counts_table(rows: list[Row]) -> str:
    """The README's tables: rows per tier and reason, then per upstream area."""
    tiers = Counter(t.tier for r in rows for t in r.twins)
    with_twin = sum(1 for r in rows if r.twins)
    reasons = Counter(r.reason for r in rows if r.reason)
    todo = sum(1 for r in rows if r.status == "todo")
    forms = Counter(r.form for r in rows if r.twins)
    fewer = sum(1 for r in rows if r.missing)
    lines = [
        f"{len(rows)} upstream CUDA tests: {with_twin} with XPU twins, {sum(reasons.values())} not applicable, "
        f"{todo} applicable without a twin yet.",
        "",
        "| twins by tier | count |",
        "|---|---|",
        *(f"| {tier} | {tiers[tier]} |" for tier in TIERS),
        "",
        "| not applicable, reason | count |",
        "|---|---|",
        *(f"| `{reason}` | {reasons[reason]} |" for reason in REASONS if reasons[reason]),
        "",
        "| rows with twins, by form in the master variant | count |",
        "|---|---|",
        *(f"| {form} | {forms[form]} |" for form in FORMS),
        "",
        f"{fewer} of the {with_twin} rows with twins have fewer cases than upstream runs on CUDA (their MISSING field "
        "says which and why).",
        "",
        "| upstream area | CUDA tests | with twins | not applicable | no twin yet |",
        "|---|---|---|---|---|",
    ]
    by_area: dict[str, Counter] = {}
    for row in rows:
        by_area.setdefault(area(row.upstream), Counter())[row.status] += 1
    for name in sorted(by_area):
        c = by_area[name]
        lines.append(f"| {name} | {sum(c.values())} | {c['twin']} | {c['n/a']} | {c['todo']} |")
    return "\n".join(lines) + "\n"


def tier_of(markers: list[dict]) -> str:
    """The tier of one collected test from its ``skipif`` marker keywords (as RunIf sets them)."""
    if any(m.get("standalone") for m in markers) and any(m.get("min_xpu_gpus") for m in markers):
        return "standalone"
    if any(m.get("min_xpu_gpus") for m in markers):
        return "emulated"
    return "mocked"


def problems(rows: list[Row], upstream: dict[str, int], collected: dict[str, list[str]] | None) -> list[str]:
    """Everything wrong with the map; ``upstream`` maps each upstream CUDA test to its CUDA case count, ``collected``
    maps collected node ids to their tiers (None: skip the checks against the patched tree)."""
    out = []
    seen = Counter(r.upstream for r in rows)
    out += [f"{u}: more than one row" for u, n in seen.items() if n > 1]
    out += [f"{u}: no row in {MAP.name}" for u in upstream if u not in seen]
    out += [f"{u}: row for a test that is not in {UPSTREAM.name}" for u in seen if u not in upstream]
    for row in rows:
        if row.reason is not None and row.reason not in REASONS:
            out.append(f"{MAP.name}:{row.line}: unknown reason {row.reason!r} (known: {', '.join(REASONS)})")
        if row.twins:
            out += _case_problems(row, upstream.get(row.upstream, 0))
        for twin in row.twins:
            if twin.tier not in TIERS:
                out.append(f"{MAP.name}:{row.line}: unknown tier {twin.tier!r} (known: {', '.join(TIERS)})")
            if collected is None:
                continue
            items = twin_cases(twin, collected)
            if not items:
                out.append(f"{MAP.name}:{row.line}: twin {twin.test_id} is not collected from the patched tree")
                continue
            # a real-hardware twin is an XPU test that skips where the device lacks what it needs (e.g. Triton)
            wanted = ("emulated", "standalone") if twin.tier == "real-hardware" else (twin.tier,)
            if not any(tier in collected[n] for n in items for tier in wanted):
                tiers = sorted({t for n in items for t in collected[n]})
                out.append(f"{MAP.name}:{row.line}: twin {twin.test_id} claims tier {twin.tier}, collected as {tiers}")
        if collected is not None and row.twins:
            found = sum(len(twin_cases(twin, collected)) for twin in row.twins)
            if found and found != row.cases:
                out.append(f"{MAP.name}:{row.line}: the row records {row.cases} cases, the patched tree has {found}")
    return out


def added_lines(series: Path = MASTER_SERIES, skip: frozenset[int] = frozenset()) -> dict[str, list[str]]:
    """Per file, the lines a patch series adds (every patch of ``series`` but those numbered in ``skip``, in name
    order)."""
    added: dict[str, list[str]] = {}
    for patch in sorted(series.glob("[0-9][0-9][0-9][0-9]-*.patch")):
        if int(patch.name[:4]) in skip:
            continue
        current = None
        for line in patch.read_text(encoding="utf-8").splitlines():
            if line.startswith("diff --git "):
                current = line.split(" b/", 1)[1]
            elif current and line.startswith("+") and not line.startswith("+++ "):
                added.setdefault(current, []).append(line[1:])
    return added


# What issue 19 asks of the master variant: XPU twins as cases of upstream's tests, not copies a reviewer has to read.
MAX_MASTER_TEST_LINES = 3000
MIN_PARAMETRISED_ROWS = 150
# Pull requests of COVER.md (by title) that are fixes of their own, none of whose tests is an XPU twin or names an XPU:
# they joined the series after issue 19 set the budget for the XPU pull requests and their groundwork, and a reviewer
# reads them apart (each needs nothing). Their test lines are not in the budget; every other line is.
OWN_FIXES = ("MPIEnvironment without mpi4py", "resuming max_steps runs from an end-of-epoch checkpoint")


def budgeted_lines(series: Path = MASTER_SERIES) -> dict[str, list[str]]:
    """The lines of :func:`added_lines` that the budget counts: those of every pull request but the ``OWN_FIXES``,
    which must exist in ``series``' COVER.md, need nothing and name no XPU in their tests."""
    from ci.gates.cover import parse_cover

    patches = len(list(series.glob("[0-9][0-9][0-9][0-9]-*.patch")))
    prs = {pr.title: pr for pr in parse_cover(series / "COVER.md", patches)}
    skip: set[int] = set()
    for title in OWN_FIXES:
        pr = prs.get(title)
        if pr is None or pr.needs:
            raise SystemExit(f"COVER.md has no pull request {title!r} that needs nothing: update OWN_FIXES")
        numbers = frozenset(range(pr.first, pr.last + 1))
        own = added_lines(series, frozenset(range(1, patches + 1)) - numbers)
        if any("xpu" in line.lower() for path, lines in own.items() if path.startswith("tests/") for line in lines):
            raise SystemExit(f"PR {pr.number} ({title}) names an XPU in its tests: its lines belong in the budget")
        skip |= numbers
    return added_lines(series, frozenset(skip))


def shape_problems(rows: list[Row], added: dict[str, list[str]]) -> list[str]:
    """The master variant adds more test lines, or records fewer parametrised twins, than the bounds above."""
    out = []
    test_lines = sum(len(lines) for path, lines in added.items() if path.startswith("tests/"))
    if test_lines > MAX_MASTER_TEST_LINES:
        out.append(f"the master variant adds {test_lines} test lines, more than {MAX_MASTER_TEST_LINES}: make XPU "
                   "twins cases of upstream's tests and keep XPU-only tests compact")
    parametrised = sum(row.form == "parametrised" for row in rows)
    if parametrised < MIN_PARAMETRISED_ROWS:
        out.append(f"{MAP.name}: {parametrised} rows record a parametrised twin, fewer than {MIN_PARAMETRISED_ROWS}")
    return out


def _adds_xpu_case(line: str) -> bool:
    """An added line that names xpu, or takes the cuda and xpu parameters of ``gpu_accelerators`` (the tests' RunIf
    helpers)."""
    return "xpu" in line.lower() or "gpu_accelerators(" in line


def form_problems(rows: list[Row], added: dict[str, list[str]]) -> list[str]:
    """Rows whose ``parametrised`` form the master variant does not bear out: it must add an XPU case to upstream's
    file (a line naming ``xpu``) and must not define the twin in the twin's own file (the release series' copy). A
    ``master-only`` row's twin exists only there, so the master variant must give upstream's test a new signature
    (the parameter its XPU case takes) and add an XPU case to its file."""
    out = []
    for row in rows:
        if row.reason == "master-only":
            path, _, name = row.upstream.partition("::")
            signature = re.compile(rf"\s*(async\s+)?def {re.escape(name)}\(")
            lines = added.get(path, [])
            if not (any(signature.match(x) for x in lines) and any(_adds_xpu_case(x) for x in lines)):
                out.append(f"{MAP.name}:{row.line}: {row.upstream} is master-only, but the master variant adds no "
                           f"XPU case to {path}")
            continue
        if row.form != "parametrised":
            continue
        path = row.upstream.partition("::")[0]
        for twin in row.twins:
            file, _, name = twin.function_id.partition("::")
            file = f"tests/{file}"
            definition = re.compile(rf"\s*(async\s+)?def {re.escape(name.split('::')[-1])}\(")
            if file != path and any(definition.match(x) for x in added.get(file, [])):
                out.append(f"{MAP.name}:{row.line}: {row.upstream} is recorded as parametrised, but the master "
                           f"variant copies it into {file}")
        if not any(_adds_xpu_case(x) for x in added.get(path, [])):
            out.append(f"{MAP.name}:{row.line}: {row.upstream} is recorded as parametrised, but the master variant "
                       f"adds no XPU case to {path}")
    return out

def twin_cases(twin: Twin, collected: dict[str, list[str]]) -> list[str]:
    """The collected node ids of a twin: the one named, or every parametrisation of the function named."""
    if "[" in twin.test_id:
        return [n for n in collected if n == twin.test_id]
    return [n for n in collected if n.split("[", 1)[0] == twin.test_id]


def _case_problems(row: Row, upstream_cases: int) -> list[str]:
    where = f"{MAP.name}:{row.line}"
    out = [] if row.form in FORMS else [f"{where}: unknown form {row.form!r} (known: {', '.join(FORMS)})"]
    if row.cases < upstream_cases and not row.missing:
        out.append(f"{where}: the twins have {row.cases} cases, upstream runs {upstream_cases} on CUDA: "
                   "add the missing ones, or name them and why in a fifth field")
    if row.cases >= upstream_cases and row.missing:
        out.append(f"{where}: the twins have all {upstream_cases} cases upstream runs on CUDA; drop the MISSING field")
    return out


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def junit_id(test_id: str) -> str:
    """A twin's ``file.py::[Class::]name[params]`` as pytest's JUnit names it: ``dotted.file[.Class]::name[params]``."""
    path, _, rest = test_id.partition("::")
    *classes, name = rest.split("::")
    return ".".join([_dotted(path), *classes]) + "::" + name


def unproven_twins(rows: list[Row], tier: str, cases: list[Case]) -> list[str]:
    """The twins that claim ``tier`` and did not pass in its run (``cases``): every case skipped, or none ran while
    other tests of its file did (a file the run left out entirely, as ``tox -e ... -- FILE`` does, is not checked)."""
    by_function: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        by_function[case.id.split("[", 1)[0]].append(case)
    # a case's JUnit class name is its module's dotted path, followed by its class where it has one
    classnames = {function.split("::", 1)[0] for function in by_function}
    modules_run = classnames | {name.rsplit(".", 1)[0] for name in classnames}
    out = []
    for row in rows:
        for twin in (t for t in row.twins if t.tier == tier):
            wanted = junit_id(twin.test_id)
            ran = [c for c in by_function[wanted.split("[", 1)[0]] if "[" not in wanted or c.id == wanted]
            if not ran and _dotted(twin.test_id.split("::", 1)[0]) in modules_run:
                out.append(f"{MAP.name}:{row.line}: twin {twin.test_id} claims tier {tier} and did not run there")
            elif ran and all(c.outcome == "skipped" for c in ran):
                out.append(f"{MAP.name}:{row.line}: twin {twin.test_id} claims tier {tier} and skipped there: "
                           f"{ran[0].message}")
    return out


def read_junit(paths: list[Path]) -> list[Case]:
    """The cases of the JUnit files (a directory: the ``*.xml`` files in it)."""
    files = [f for p in paths for f in (sorted(p.glob("*.xml")) if p.is_dir() else [p])]
    return [case for f in files for case in read_cases(f)]


def scan_checkout(checkout: Path, ref: str) -> dict[str, int]:
    """The test functions of ``ref`` whose decorators call ``RunIf(min_cuda_gpus=...)``, as ``tests/...::name``, each
    with the number of its cases upstream runs on CUDA (``cuda_case_count``)."""
    git = ["git", "-C", str(checkout)]
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", ref, "tests"], check=True, capture_output=True,
                           text=True).stdout.split()
    found = {}
    for name in names:
        if not (name.endswith(".py") and Path(name).name.startswith("test")):
            continue
        source = subprocess.run([*git, "show", f"{ref}:{name}"], check=True, capture_output=True, text=True).stdout
        module = ast.parse(source)
        for node in ast.walk(module):
            is_test = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
            if is_test and any(_marks_cuda(d) for d in node.decorator_list):
                found[f"{name}::{node.name}"] = cuda_case_count(node, module)
    return found


def cuda_case_count(test: ast.FunctionDef | ast.AsyncFunctionDef, module: ast.Module) -> int:
    """How many of a test's parametrised cases run on a CUDA machine, read from its decorators.

    Where the function carries the CUDA mark, every case of its ``parametrize`` lists counts except a ``pytest.param``
    skipped unconditionally (``marks=pytest.mark.skip(...)``) or marked for another device (``RunIf(mps=True)``);
    where only some ``pytest.param`` values carry it, those count, times the cases of the other lists.
    """
    marked_function = any(_marks_cuda(d) and not _is_parametrize(d) for d in test.decorator_list)
    count = 1
    for decorator in (d for d in test.decorator_list if _is_parametrize(d)):
        argvalues = decorator.args[1] if len(decorator.args) > 1 else _keyword(decorator, "argvalues")
        values = _literal_values(argvalues, module) if argvalues is not None else None
        if values is None:
            raise MatrixError(f"{test.name}: parametrize values that are not a literal list; count its cases by hand")
        runs = [v for v in values if not _param_marks(v, _is_unconditional_skip)]
        on_cuda = [v for v in runs if not _param_marks(v, _marks_other_device)]
        marked = [v for v in runs if _param_marks(v, _marks_cuda)]
        count *= len(on_cuda) if marked_function or not marked else len(marked)
    return count


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _is_parametrize(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "parametrize"


def _literal_values(node: ast.expr, module: ast.Module) -> list[ast.expr] | None:
    """The elements of a ``parametrize`` value list: a literal, or a module-level name bound to one."""
    if isinstance(node, ast.List | ast.Tuple):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else list(node.elts)
    if isinstance(node, ast.Name):
        for statement in module.body:
            if isinstance(statement, ast.Assign) and any(getattr(t, "id", None) == node.id for t in statement.targets):
                return _literal_values(statement.value, module)
    return None


def _param_marks(value: ast.expr, test: Callable[[ast.expr], bool]) -> bool:
    """Whether ``value`` is a ``pytest.param(..., marks=...)`` whose marks satisfy ``test``."""
    is_param = isinstance(value, ast.Call) and getattr(value.func, "attr", None) == "param"
    return is_param and any(kw.arg == "marks" and test(kw.value) for kw in value.keywords)


def _is_unconditional_skip(marks: ast.expr) -> bool:
    return any(isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "skip" for node in ast.walk(marks))


def _marks_other_device(marks: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RunIf"
        and any(kw.arg in ("mps", "tpu") for kw in node.keywords)
        for node in ast.walk(marks)
    )


def _marks_cuda(decorator: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RunIf"
        and any(kw.arg == "min_cuda_gpus" for kw in node.keywords)
        for node in ast.walk(decorator)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", action="store_true", help="print the README's count tables")
    parser.add_argument("--scan", type=Path, metavar="CHECKOUT", help="list the CUDA tests of an upstream checkout")
    parser.add_argument("--outcomes", choices=TIERS[:3], metavar="TIER",
                        help="check that TIER's twins passed in the JUnit files given as the arguments")
    parser.add_argument("refs", nargs="*", default=["2.6.5", "master"],
                        help="refs to scan (default: 2.6.5 master), or with --outcomes the JUnit files")
    ns = parser.parse_args(argv)
    if ns.outcomes:
        cases = read_junit([Path(p) for p in ns.refs])
        if not cases:
            print(f"cuda matrix: no test cases in {' '.join(ns.refs)}: the {ns.outcomes} tier did not report")
            return 1
        found = unproven_twins(read_map(), ns.outcomes, cases)
        print("\n".join(found) or f"cuda matrix: no twin of the {ns.outcomes} tier skipped or went missing in "
                                   f"{len(cases)} cases")
        return 1 if found else 0
    if ns.scan:
        # a test on both refs keeps the larger count: a twin must cover the cases of either
        cases: dict[str, int] = {}
        for ref in ns.refs:
            for test, count in scan_checkout(ns.scan, ref).items():
                cases[test] = max(count, cases.get(test, 0))
        print("\n".join(f"{test}\t{cases[test]}" for test in sorted(cases)))
        return 0
    rows = read_map()
    if ns.table:
        print(counts_table(rows), end="")
        return 0
    added = added_lines()
    found = problems(rows, read_upstream(), None) + form_problems(rows, added) + shape_problems(rows, budgeted_lines())
    print("\n".join(found) or f"{len(rows)} rows, no problems (twins not checked against a tree)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
