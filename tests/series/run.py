"""Run the tests that the patch series carries, against a patched Lightning.

The series adds its tests under upstream's ``tests/tests_fabric`` and ``tests/tests_pytorch``. This script copies them
out of a patched source tree, adds the harness in ``support/`` where upstream's own test environment would be, and runs
pytest there::

    python tests/series/run.py --tree TREE [--src] [--import-root standalone] [--standalone] [-- PYTEST_ARGS...]

``--src`` imports Lightning from ``TREE/src`` (development); by default the installed (patched) Lightning is tested.
``--import-root standalone`` rewrites the copied tests to ``lightning_fabric`` / ``pytorch_lightning``, the way
upstream's CI tests the standalone distributions. ``--standalone`` runs every ``RunIf(standalone=True)`` test in a
process of its own, as upstream's ``run_standalone_tests.sh`` does, ``--parallel N`` of them at a time (default
``$NUM_PARALLEL_TESTS`` or 1, as in that script).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from ci.junit import read_cases  # noqa: E402

SUPPORT = Path(__file__).parent / "support"
# xpu_tier_ranks: ranks 1..N-1 of a standalone test write their JUnit files beside rank 0's instead of over it
RANK_PLUGIN = REPO / "ci" / "intel" / "plugins"
SUITES = ("tests_fabric", "tests_pytorch")
_IMPORT = re.compile(r"(?<![\w/@.])lightning\.(fabric|pytorch)(?![\w/])")
_STANDALONE_ROOTS = {"fabric": "lightning_fabric", "pytorch": "pytorch_lightning"}
# Standalone tests (a function, or one case of it) in which torch's own code races on XPU streams, each with the
# evidence. The emulator's stream sanitizer (on by default, lightning_xpu/emulator/README.md) is off in their processes
# alone; an Intel GPU ignores it.
_FSDP1_WRITEBACK_RACE = (
    "FSDP1's post-backward stream adds into _saved_grad_shard what its pre-unshard stream wrote, unordered; "
    "CUDA's TORCH_CUDA_SANITIZER=1 reports the same race (ci/cuda/fsdp1_writeback_race.py)"
)
TORCH_STREAM_RACES = {
    "tests_pytorch/strategies/test_fsdp_integration_xpu.py::test_strategy_sync_batchnorm": _FSDP1_WRITEBACK_RACE,
    # the same model and precision as test_strategy_sync_batchnorm, the same report (the bf16-mixed cases do not race)
    "tests_pytorch/strategies/test_fsdp_integration_xpu.py::test_strategy_checkpoint[sharded-32-true]": (
        _FSDP1_WRITEBACK_RACE
    ),
    "tests_pytorch/strategies/test_fsdp_integration_xpu.py::test_strategy_checkpoint[full-32-true]": (
        _FSDP1_WRITEBACK_RACE
    ),
    # the same tests in upstream's tree with the master variant (ci/replay_upstream.py --xpus), as xpu cases
    "tests_pytorch/strategies/test_fsdp.py::test_strategy_sync_batchnorm[xpu]": _FSDP1_WRITEBACK_RACE,
    "tests_pytorch/strategies/test_fsdp.py::test_strategy_checkpoint[sharded-xpu-32-true]": _FSDP1_WRITEBACK_RACE,
    "tests_pytorch/strategies/test_fsdp.py::test_strategy_checkpoint[full-xpu-32-true]": _FSDP1_WRITEBACK_RACE,
    # the model (nested FSDP units), strategy and precision of test_strategy_sync_batchnorm; the emulator stops in
    # FSDP1's _reduce_grad, and `fsdp1_writeback_race.py --nested` has CSAN report the same race on CUDA
    "tests_pytorch/strategies/test_fsdp.py::test_checkpoint_multi_gpus[manually_wrapped-xpu]": _FSDP1_WRITEBACK_RACE,
}


def rewrite_imports(text: str) -> str:
    """``lightning.fabric`` -> ``lightning_fabric`` and ``lightning.pytorch`` -> ``pytorch_lightning``."""
    return _IMPORT.sub(lambda m: _STANDALONE_ROOTS[m.group(1)], text)


def materialize(tree: Path, dest: Path, standalone_roots: bool = False) -> list[str]:
    """Copy the series' test suites from ``tree`` into ``dest`` with the harness; return the suites found."""
    suites = [s for s in SUITES if (tree / "tests" / s).is_dir()]
    if not suites:
        raise SystemExit(f"{tree}/tests has none of {SUITES}: is the series applied to this tree?")
    shutil.copy2(SUPPORT / "conftest.py", dest / "conftest.py")
    for suite in suites:
        shutil.copytree(tree / "tests" / suite, dest / suite)
        for support_file in (SUPPORT / suite).rglob("*.py"):
            target = dest / suite / support_file.relative_to(SUPPORT / suite)
            if not target.exists():  # upstream's own file wins where the tree has one
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(support_file, target)
        _add_package_markers(dest / suite)
    if standalone_roots:
        for path in dest.rglob("*.py"):
            path.write_text(rewrite_imports(path.read_text()))
    return suites


def _add_package_markers(suite_dir: Path) -> None:
    """Give every test folder an ``__init__.py``, as upstream's test tree has.

    The series adds test files whose basenames repeat across folders and suites (``accelerators/test_xpu.py`` and
    ``models/test_xpu.py``, ``tests_fabric/.../test_amp_xpu.py`` and ``tests_pytorch/.../test_amp_xpu.py``, like
    upstream's ``test_gpu.py`` and ``test_amp.py``); pytest imports them as distinct modules only inside packages.
    """
    for folder in [suite_dir, *(p for p in suite_dir.rglob("*") if p.is_dir() and p.name != "__pycache__")]:
        marker = folder / "__init__.py"
        if not marker.exists():
            marker.touch()


def _pytest_command(dest: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(dest), *args]


def _pytest(dest: Path, args: list[str], env: dict[str, str]) -> int:
    return subprocess.call(_pytest_command(dest, args), cwd=dest, env=env)


def _pytest_quietly(dest: Path, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run pytest with its output (and its ranks') captured, for printing in one piece when it ends."""
    start = time.monotonic()
    proc = subprocess.run(_pytest_command(dest, args), cwd=dest, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return proc.returncode, f"{proc.stdout}({time.monotonic() - start:.1f} s)"


def _per_node(args: list[str], index: int) -> list[str]:
    """Give each standalone process its own JUnit file: ``--junitxml=out.xml`` -> ``out.standalone-3.xml``."""
    return [
        f"{a.removesuffix('.xml')}.standalone-{index}.xml" if a.startswith("--junitxml=") else a for a in args
    ]


def _with_junit(args: list[str], junit: Path) -> list[str]:
    """The arguments with a JUnit file for rank 0 (the caller's, or ``junit``) and the plugin that keeps it rank 0's."""
    if not any(a.startswith("--junitxml=") for a in args):
        args = [*args, f"--junitxml={junit}"]
    return args if "xpu_tier_ranks" in args else [*args, "-p", "xpu_tier_ranks"]


def _outcome(returncode: int, args: list[str]) -> str:
    """``passed``, ``skipped`` (rank 0 skipped all it ran) or ``failed``, from the exit code and rank 0's JUnit."""
    if returncode:
        return "failed"
    cases = read_cases(Path(next(a for a in args if a.startswith("--junitxml=")).split("=", 1)[1]))
    if not cases:
        return "failed"  # rank 0 did not report: nothing was proven
    return "skipped" if all(c.outcome == "skipped" for c in cases) else "passed"


def _sanitizer_setting(node: str) -> dict[str, str]:
    """``LIGHTNING_XPU_EMULATOR_SANITIZER=0`` for a test in ``TORCH_STREAM_RACES`` (saying why), else nothing."""
    node = node.removeprefix("./")
    reason = TORCH_STREAM_RACES.get(node) or TORCH_STREAM_RACES.get(node.split("[")[0])
    if reason is None:
        return {}
    print(f"standalone: the emulator's stream sanitizer is off for {node}: {reason}", flush=True)
    return {"LIGHTNING_XPU_EMULATOR_SANITIZER": "0"}


def _named_paths(dest: Path, args: list[str]) -> list[str]:
    """The test paths (``file``, ``dir`` or ``file::node``) among the pytest arguments."""
    return [a for a in args if not a.startswith("-") and (dest / a.split("::")[0]).exists()]


def run_standalone(dest: Path, suites: list[str], args: list[str], env: dict[str, str], parallel: int = 1) -> int:
    """Run each standalone test in its own process, ``parallel`` at a time; fail if any fails or none was found.

    Test paths among ``args`` narrow the collection (default: every suite); the other arguments (``-k``, ``-m``, ...)
    narrow it too and go to every test's process. Each test picks its own free port for its process group, so tests
    running at the same time do not meet.
    """
    env = {**env, "PL_RUN_STANDALONE_TESTS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(RANK_PLUGIN), env.get("PYTHONPATH")]))}
    named = _named_paths(dest, args)
    args = [a for a in args if a not in named]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(dest), "-q", "--collect-only",
         *(a for a in args if not a.startswith("--junitxml")), *(named or suites)],
        cwd=dest, env=env, capture_output=True, text=True,
    )
    node_ids = [line for line in collected.stdout.splitlines() if "::" in line]
    if collected.returncode not in (0, 5):
        print(collected.stdout, collected.stderr, sep="\n")
        return collected.returncode
    if not node_ids:  # a standalone tier that ran nothing has proven nothing
        print("standalone: no standalone test was collected")
        return 1
    # outside the test tree: upstream's conftest fails a test that leaves new files under tests/, and a test running
    # beside it would write its JUnit file and temporary files there
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-standalone-") as scratch:
        return _run_each(dest, node_ids, args, env, parallel, Path(scratch))


def _run_each(dest: Path, node_ids: list[str], args: list[str], env: dict[str, str], parallel: int,
              scratch: Path) -> int:
    runs = [["-q", *_with_junit(_per_node(args, i), scratch / f"test-{i}.xml"), node]
            for i, node in enumerate(node_ids)]
    # each test (all its ranks) gets a temporary directory of its own: pytest removes old numbered base directories
    # at start-up, which would pull a running test's tmp_path from under it
    envs = [{**env, "TMPDIR": str(scratch / f"tmp-{i}"), **_sanitizer_setting(node)}
            for i, node in enumerate(node_ids)]
    for run_env in envs:
        Path(run_env["TMPDIR"]).mkdir()
    if parallel <= 1:
        codes = [_pytest(dest, run, run_env) for run, run_env in zip(runs, envs, strict=True)]
    else:
        codes = []
        with ThreadPoolExecutor(parallel) as pool:
            submitted = [pool.submit(_pytest_quietly, dest, run, run_env)
                         for run, run_env in zip(runs, envs, strict=True)]
            for node, result in zip(node_ids, submitted, strict=True):
                returncode, output = result.result()
                print(f"--- {node}", output, sep="\n", flush=True)
                codes.append(returncode)
    outcomes = [_outcome(code, run) for code, run in zip(codes, runs, strict=True)]
    failed = [node for node, outcome in zip(node_ids, outcomes, strict=True) if outcome == "failed"]
    skipped = [node for node, outcome in zip(node_ids, outcomes, strict=True) if outcome == "skipped"]
    print(f"standalone: {outcomes.count('passed')} passed, {len(skipped)} skipped, {len(failed)} failed")
    for node in skipped:
        print(f"SKIPPED {node}")
    for node in failed:
        print(f"FAILED {node}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, required=True, help="a Lightning source tree with the series applied")
    parser.add_argument("--src", action="store_true", help="import Lightning from TREE/src instead of site-packages")
    parser.add_argument("--import-root", choices=("lightning", "standalone"), default="lightning")
    parser.add_argument("--standalone", action="store_true", help="run the standalone tests, one process each")
    parser.add_argument("--parallel", type=int, default=int(os.environ.get("NUM_PARALLEL_TESTS", "1")),
                        help="with --standalone: how many tests run at a time (default: $NUM_PARALLEL_TESTS or 1)")
    parser.add_argument("--keep", type=Path, help="materialise into this (empty) directory and keep it")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (put them after --)")
    ns = parser.parse_args(argv)

    tree = ns.tree.resolve()
    env = dict(os.environ)
    if ns.src:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "src"), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-series-tests-") as tmp:
        dest = ns.keep.resolve() if ns.keep else Path(tmp)
        dest.mkdir(parents=True, exist_ok=True)
        suites = materialize(tree, dest, standalone_roots=ns.import_root == "standalone")
        if ns.standalone:
            return run_standalone(dest, suites, ns.pytest_args, env, ns.parallel)
        # explicit test paths in the pytest arguments narrow the run; otherwise run every suite
        named = _named_paths(dest, ns.pytest_args)
        return _pytest(dest, [*ns.pytest_args, *([] if named else suites)], env)


if __name__ == "__main__":
    sys.exit(main())
