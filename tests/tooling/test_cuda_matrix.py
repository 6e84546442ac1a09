"""The XPU test matrix (ci/cuda_matrix.tsv) maps every upstream CUDA test to XPU twins that exist, or to a reason."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import cuda_matrix
from ci.junit import Case
from lightning_xpu.base import Base
from lightning_xpu.series import load_series
from lightning_xpu.workspace import create_workspace

from .conftest import PATCHES, REPO

_TIER_FILTERS_OFF = {"RUN_ONLY_XPU_TESTS": "0", "RUN_ONLY_CUDA_TESTS": "0", "PL_RUN_STANDALONE_TESTS": "0",
                     "LIGHTNING_XPU_EMULATOR": "0"}


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory, base: Base, cache: Path) -> dict[str, list[str]]:
    """Every test the real series carries, collected from the patched tree, with its tier."""
    root = tmp_path_factory.mktemp("matrix")
    tree = create_workspace(load_series(PATCHES), base, root / "tree", cache)
    out = root / "collected.json"
    env = {**os.environ, **_TIER_FILTERS_OFF, "CUDA_MATRIX_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "ci"), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests/series/run.py"), "--tree", str(tree), "--src", "--",
         "--collect-only", "-q", "-p", "cuda_matrix_collect"],
        env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_upstream_cuda_test_has_one_valid_row() -> None:
    rows = cuda_matrix.read_map()
    assert cuda_matrix.problems(rows, cuda_matrix.read_upstream(), None) == []
    assert len(rows) == len(cuda_matrix.read_upstream())


def test_every_parametrised_twin_is_a_case_of_upstreams_test_in_the_master_variant() -> None:
    rows = cuda_matrix.read_map()
    assert any(r.form == "parametrised" for r in rows)
    assert cuda_matrix.form_problems(rows, cuda_matrix.added_lines()) == []


def test_the_master_variant_stays_within_its_test_line_budget() -> None:
    assert cuda_matrix.shape_problems(cuda_matrix.read_map(), cuda_matrix.budgeted_lines()) == []


def test_the_shape_check_catches_too_many_test_lines_and_too_few_parametrised_rows() -> None:
    row = cuda_matrix.Row("tests/tests_x/test_a.py::test_b", twins=(), line=7, form="copied", cases=1)
    added = {"tests/tests_x/test_a.py": ["x"] * cuda_matrix.MAX_MASTER_TEST_LINES, "src/a.py": ["y"] * 10}
    assert cuda_matrix.shape_problems([row], added) == [
        f"cuda_matrix.tsv: 0 rows record a parametrised twin, fewer than {cuda_matrix.MIN_PARAMETRISED_ROWS}"]
    added["tests/tests_x/test_c.py"] = ["z"]
    assert "adds 3001 test lines" in cuda_matrix.shape_problems([row], added)[0]


def test_the_form_check_catches_a_copy_and_a_missing_xpu_case() -> None:
    twin = cuda_matrix.Twin("emulated", "tests_x/test_a_xpu.py::test_b[xpu]")
    row = cuda_matrix.Row("tests/tests_x/test_a.py::test_b", twins=(twin,),
                          line=7, form="parametrised", cases=1)
    copied = {"tests/tests_x/test_a_xpu.py": ["def test_b(tmp_path):"], "tests/tests_x/test_a.py": ["    # xpu"],
              "tests/tests_x/test_c_xpu.py": ["def test_b(tmp_path):"]}  # another upstream test of that name
    assert [p.split(": ", 1)[1] for p in cuda_matrix.form_problems([row], copied)] == [
        "tests/tests_x/test_a.py::test_b is recorded as parametrised, but the master variant copies it into "
        "tests/tests_x/test_a_xpu.py"
    ]
    parametrised = {"tests/tests_x/test_a.py": ['        pytest.param("xpu", marks=RunIf(min_xpu_gpus=1)),']}
    assert cuda_matrix.form_problems([row], parametrised) == []
    helper = {"tests/tests_x/test_a.py": ['@pytest.mark.parametrize("accelerator", gpu_accelerators(2))']}
    assert cuda_matrix.form_problems([row], helper) == []
    assert len(cuda_matrix.form_problems([row], {"tests/tests_x/test_a.py": ["    # gpu"]})) == 1
    assert len(cuda_matrix.form_problems([row], {})) == 1
    master_only = cuda_matrix.Row("tests/tests_x/test_a.py::test_b", reason="master-only", line=8)
    assert cuda_matrix.form_problems([master_only], {"tests/tests_x/test_a.py": [
        "def test_b(accelerator, tmp_path):", '        pytest.param("xpu", marks=RunIf(min_xpu_gpus=1)),']}) == []
    # an XPU case of another test in the same file is not this test's twin
    assert len(cuda_matrix.form_problems([master_only], parametrised)) == 1
    assert [p.split(": ", 1)[1] for p in cuda_matrix.form_problems([master_only], {})] == [
        "tests/tests_x/test_a.py::test_b is master-only, but the master variant adds no XPU case to "
        "tests/tests_x/test_a.py"
    ]


def test_every_twin_is_collected_from_the_patched_tree_with_its_tier(collected: dict[str, list[str]]) -> None:
    rows = cuda_matrix.read_map()
    assert sum(len(r.twins) for r in rows) > 0
    assert cuda_matrix.problems(rows, cuda_matrix.read_upstream(), collected) == []


def test_the_check_catches_a_missing_row_a_bad_reason_and_a_twin_that_does_not_exist(
    collected: dict[str, list[str]],
) -> None:
    rows = cuda_matrix.read_map()
    upstream = cuda_matrix.read_upstream()
    twin_row = next(r for r in rows if r.twins)
    broken = [
        cuda_matrix.Row(rows[0].upstream, reason="not-a-reason"),
        cuda_matrix.Row(twin_row.upstream, twins=(cuda_matrix.Twin("emulated", "tests_fabric/test_nothing.py::x"),)),
        *(r for r in rows[1:] if r.upstream not in {twin_row.upstream, rows[-1].upstream}),
    ]
    found = "\n".join(cuda_matrix.problems(broken, upstream, collected))
    assert "unknown reason 'not-a-reason'" in found
    assert "twin tests_fabric/test_nothing.py::x is not collected" in found
    assert f"{rows[-1].upstream}: no row" in found


def test_the_check_catches_a_twin_in_the_wrong_tier(collected: dict[str, list[str]]) -> None:
    mocked = next(n for n, tiers in collected.items() if tiers == ["mocked"])
    twin = cuda_matrix.Twin("standalone", mocked)
    row = cuda_matrix.Row("tests/x.py::test_x", twins=(twin,), form="copied",
                          cases=len(cuda_matrix.twin_cases(twin, collected)))
    assert cuda_matrix.problems([row], {"tests/x.py::test_x": 1}, collected) == [
        f"{cuda_matrix.MAP.name}:0: twin {mocked} claims tier standalone, collected as ['mocked']"
    ]


@pytest.mark.skipif(not os.environ.get("LIGHTNING_UPSTREAM_CHECKOUT"), reason="needs $LIGHTNING_UPSTREAM_CHECKOUT "
                    "(an upstream git checkout); this CI cannot reach GitHub")
def test_upstream_list_matches_the_checkout() -> None:
    checkout = Path(os.environ["LIGHTNING_UPSTREAM_CHECKOUT"])
    found: dict[str, int] = {}
    for ref in ("2.6.5", "master"):
        for test, cases in cuda_matrix.scan_checkout(checkout, ref).items():
            found[test] = max(cases, found.get(test, 0))
    assert found == cuda_matrix.read_upstream()


def _twin_row(cases: int, missing: str | None = None, form: str = "copied") -> cuda_matrix.Row:
    twin = cuda_matrix.Twin("emulated", "tests_fabric/test_a.py::test_a")
    return cuda_matrix.Row("tests/tests_fabric/test_a.py::test_a", twins=(twin,), line=7, form=form, cases=cases,
                           missing=missing)


def test_the_check_wants_every_case_upstream_runs_on_cuda_or_a_note_naming_the_missing_ones() -> None:
    upstream = {"tests/tests_fabric/test_a.py::test_a": 3}
    collected = {f"tests_fabric/test_a.py::test_a[{p}]": ["emulated"] for p in ("32-true", "bf16-mixed")}
    assert cuda_matrix.problems([_twin_row(2, "16-mixed: not twinned yet")], upstream, collected) == []
    assert cuda_matrix.problems([_twin_row(2)], upstream, collected) == [
        "cuda_matrix.tsv:7: the twins have 2 cases, upstream runs 3 on CUDA: add the missing ones, or name them and "
        "why in a fifth field"
    ]
    three = {**collected, "tests_fabric/test_a.py::test_a[16-mixed]": ["emulated"]}
    assert cuda_matrix.problems([_twin_row(3, "16-mixed: not twinned yet")], upstream, three) == [
        "cuda_matrix.tsv:7: the twins have all 3 cases upstream runs on CUDA; drop the MISSING field"
    ]
    assert cuda_matrix.problems([_twin_row(3)], upstream, collected) == [
        "cuda_matrix.tsv:7: the row records 3 cases, the patched tree has 2"
    ]
    assert cuda_matrix.problems([_twin_row(3, form="pasted")], upstream, three) == [
        "cuda_matrix.tsv:7: unknown form 'pasted' (known: parametrised, copied)"
    ]


def test_a_row_with_twins_must_give_form_and_cases(tmp_path: Path) -> None:
    tsv = tmp_path / "matrix.tsv"
    tsv.write_text("tests/x.py::test_x\temulated:tests_fabric/x.py::test_x\n")
    with pytest.raises(cuda_matrix.MatrixError, match="UPSTREAM, TWINS, FORM, CASES"):
        cuda_matrix.read_map(tsv)
    tsv.write_text("tests/x.py::test_x\temulated:tests_fabric/x.py::test_x\tcopied\t2\tbf16: why\n")
    assert cuda_matrix.read_map(tsv)[0].missing == "bf16: why"


_CASES_SOURCE = """
import pytest
PRECISIONS = ["32-true", "16-mixed"]

@RunIf(min_cuda_gpus=2, standalone=True)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("clip", [pytest.param("norm", marks=pytest.mark.skip("broken")), "val"])
def test_marked_function(precision, clip): ...

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("accelerator", [
    "cpu",
    pytest.param("cuda", marks=RunIf(min_cuda_gpus=1)),
    pytest.param("mps", marks=RunIf(mps=True)),
])
def test_marked_params(accelerator, precision): ...

@RunIf(min_cuda_gpus=1)
@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=RunIf(mps=True))])
def test_other_device(devices): ...

@RunIf(min_cuda_gpus=1)
@pytest.mark.parametrize("devices", range(3))
def test_not_literal(devices): ...

@RunIf(min_cuda_gpus=1)
@pytest.mark.parametrize("precision", [*PRECISIONS, "bf16-mixed"])
def test_starred(precision): ...
"""


def _parsed(name: str) -> tuple[ast.FunctionDef, ast.Module]:
    module = ast.parse(_CASES_SOURCE)
    return next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), module


# two precisions times "val" ("norm" is skipped unconditionally); the cuda case of two precisions (cpu runs everywhere,
# mps elsewhere); one devices value (the other is an MPS case)
@pytest.mark.parametrize(("name", "cases"), [("test_marked_function", 2), ("test_marked_params", 2),
                                             ("test_other_device", 1)])
def test_upstream_case_counts_are_read_from_the_decorators(name: str, cases: int) -> None:
    assert cuda_matrix.cuda_case_count(*_parsed(name)) == cases


@pytest.mark.parametrize("name", ["test_not_literal", "test_starred"])
def test_a_parametrisation_the_scan_cannot_read_is_an_error(name: str) -> None:
    with pytest.raises(cuda_matrix.MatrixError, match=f"{name}: parametrize values that are not a literal list"):
        cuda_matrix.cuda_case_count(*_parsed(name))


def _row(tier: str, twin: str) -> cuda_matrix.Row:
    return cuda_matrix.Row("tests/" + twin.split("::")[0], twins=(cuda_matrix.Twin(tier, twin),))


def test_outcomes_name_a_twin_that_skipped_or_did_not_run_in_its_tier() -> None:
    rows = [
        _row("emulated", "tests_fabric/x/test_a.py::test_a"),
        _row("emulated", "tests_fabric/test_b.py::T::test_b[1]"),
        _row("emulated", "tests_fabric/test_c.py::test_c"),
        _row("standalone", "tests_fabric/test_d.py::test_d"),
    ]
    cases = [
        Case("tests_fabric.x.test_a::test_a[bf16]", "skipped", "needs an XPU"),
        Case("tests_fabric.x.test_a::test_a[32]", "passed"),
        Case("tests_fabric.test_b.T::test_b[1]", "skipped", "needs an XPU without fp64"),
        Case("tests_fabric.test_b.T::test_b[2]", "passed"),
        Case("tests_fabric.test_c::test_c_helper", "passed"),  # its file ran, test_c did not
    ]
    found = cuda_matrix.unproven_twins(rows, "emulated", cases)
    assert len(found) == 2
    assert "test_b.py::T::test_b[1] claims tier emulated and skipped there: needs an XPU without fp64" in found[0]
    assert "tests_fabric/test_c.py::test_c claims tier emulated and did not run there" in found[1]
    passing = [Case("tests_fabric.test_b.T::test_b[1]", "passed"), Case("tests_fabric.test_c::test_c", "passed")]
    assert cuda_matrix.unproven_twins(rows, "emulated", [*cases, *passing]) == []
    assert cuda_matrix.unproven_twins(rows, "emulated", cases[:4]) == found[:1]  # a run that left test_c.py out


def test_the_outcomes_check_reads_junit_files_and_directories(tmp_path: Path) -> None:
    junit = tmp_path / "tier"
    junit.mkdir()
    (junit / "rank0.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests_fabric.test_c" name="test_c"><skipped message="no XPU"/>'
        "</testcase></testsuite></testsuites>"
    )
    cases = cuda_matrix.read_junit([junit])
    assert cases == [Case("tests_fabric.test_c::test_c", "skipped", "no XPU")]
    proc = subprocess.run([sys.executable, str(REPO / "ci" / "cuda_matrix.py"), "--outcomes", "emulated",
                           str(tmp_path / "missing.xml")], capture_output=True, text=True)
    assert proc.returncode == 1 and "the emulated tier did not report" in proc.stdout


def test_the_budget_leaves_out_only_the_pull_requests_of_their_own() -> None:
    def test_lines(added: dict[str, list[str]]) -> int:
        return sum(len(lines) for path, lines in added.items() if path.startswith("tests/"))

    # PRs 4 and 5: one patch each, no XPU line
    assert 0 < test_lines(cuda_matrix.added_lines()) - test_lines(cuda_matrix.budgeted_lines()) < 300
