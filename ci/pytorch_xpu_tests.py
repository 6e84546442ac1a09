"""PyTorch's own XPU runtime tests against the emulated XPU: the emulator's fidelity check by a specification
nobody here wrote.

PyTorch's ``test/test_xpu.py`` (the runtime, allocator, streams, events, GPU trace, MemPool, the XPU autocast
cases) and ``test/distributed/test_c10d_xccl.py`` run unmodified under ``LIGHTNING_XPU_EMULATOR``; every test that
fails must be one ``EXPECTED_FAILURES`` explains (it needs an XPU build or an Intel GPU, or it is a shortfall of the
emulator recorded as such), and every test it explains must still fail, so the list cannot go stale. The test files are
PyTorch's: this script fetches nothing; point it at a directory laid out as PyTorch's ``test/`` (see
benchmarks/results/pytorch-xpu-tests.md for where they came from):

  python ci/pytorch_xpu_tests.py run DIR OUT [--torch 2.8] [--device b580] [--markdown FILE]
  python ci/pytorch_xpu_tests.py report OUT [--torch 2.13] [--markdown FILE]

``run`` writes one JUnit XML per file into OUT and then reports; ``report`` exits 1 on an unexplained failure or a
stale explanation.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.junit import Case, read_cases  # noqa: E402

# PyTorch's test files, relative to its test/ directory, and the emulated devices each needs.
SUITES = {"test_xpu.py": 2, "distributed/test_c10d_xccl.py": 4}  # 4: test_xccl_barrier puts rank 1 on xpu:2

_XPU_BUILD = "an XPU build of torch"
_FR = ("not emulated: ProcessGroupXCCL's flight recorder (`torch._C._distributed_c10d._dump_xccl_trace` and "
       "`get_xccl_version` do not exist, `TORCH_FR_*` do nothing): the tests check ProcessGroupXCCL's bookkeeping "
       "around c10d's FlightRecorder (sequence numbers, Work events and states, status counters, the dump pipe); "
       "the emulator's README says why it is left out")
# Tests the emulator cannot pass, by JUnit id (``module.Class::test``), and why: most need an XPU build or an Intel
# GPU; "not emulated" and "emulator gap" entries are the emulator's own shortfalls, recorded so that a change in them
# shows (an entry whose test passes is stale and fails the check). ``passes_on``: device profiles where it passes.
EXPECTED_FAILURES: dict[str, dict[str, object]] = {
    "test_xpu.TestXpu::test_torch_version_xpu": {
        "why": f"{_XPU_BUILD}: runs `ldd` on libtorch_xpu.so to find one libsycl.so; a CPU build has no such library "
        "(its first half, torch.version.xpu as an 8-digit SYCL compiler version, passes)",
    },
    "test_xpu.TestXpu::test_xpu_pluggable_allocator": {
        "why": "a SYCL toolchain and an XPU build: compiles an allocator with `load_inline(with_sycl=True)` against "
        "<c10/xpu/XPUFunctions.h> and sycl::malloc_shared",
    },
    "test_xpu.TestXpu::test_set_per_process_memory_fraction": {
        "why": "host memory: allocates 49 % of the device's total memory for real (31 GiB of a Max 1550 stack); the "
        "emulator backs device memory with host memory, so it passes where the host has that much free (the Arc "
        "B580 profile's 12 GiB device on a 23 GiB host)",
        "passes_on": ("b580", "arc-a770"),
    },
    **{f"test_c10d_xccl.XCCLTraceTest::{t}": {"why": _FR} for t in (
        "test_short_pickle_include_collectives_True", "test_short_pickle_include_collectives_False", "test_dump_pipe",
        "test_long", "test_barrier_profiling", "test_batched_send_recv_op_sizes_per_coalesce0_timing_enabled_False",
        "test_batched_send_recv_op_sizes_per_coalesce1_timing_enabled_False",
        "test_individual_send_recv_op_sizes0_timing_enabled_False",
        "test_individual_send_recv_op_sizes1_timing_enabled_False", "test_allgather_uneven_timing_enabled_False",
        "test_coalescing_manager_collective_timing_enabled_False")},
}
# What a release profile lacks makes its tests fail there as on that release (AttributeError on a missing name).
NEEDS_RELEASE: dict[str, tuple[int, int]] = {
    "test_xpu.TestMemPool::test_mempool_id": (2, 11),
    "test_xpu.TestMemPool::test_mempool_multithread": (2, 11),
    "test_xpu.TestMemPool::test_mempool_empty_cache": (2, 11),
    "test_xpu.TestXpu::test_set_per_process_memory_fraction": (2, 10),
    "test_xpu.TestXpu::test_can_device_access_peer": (2, 10),
}


def release(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def expected_failure(case_id: str, torch_release: tuple[int, int], device: str) -> str | None:
    """Why ``case_id`` cannot pass on the emulator for this profile, or None if it must pass."""
    since = NEEDS_RELEASE.get(case_id)
    if since is not None and torch_release < since:
        profile = f"{torch_release[0]}.{torch_release[1]}"
        return f"torch {since[0]}.{since[1]}+ API: the {profile} profile lacks it, as that release does"
    entry = EXPECTED_FAILURES.get(case_id)
    if entry is None or device in entry.get("passes_on", ()):  # type: ignore[operator]
        return None
    return str(entry["why"])


def check(cases: list[Case], torch_release: tuple[int, int], device: str) -> tuple[list[str], list[str]]:
    """(failures no reason explains, explained tests that did not fail)."""
    unexplained, stale = [], []
    for case in cases:
        why = expected_failure(case.id, torch_release, device)
        failed = case.outcome in ("failed", "error")
        if failed and why is None:
            unexplained.append(f"{case.id}: {case.message}")
        elif not failed and why is not None:
            stale.append(f"{case.id} ({case.outcome}), explained as: {why}")
    return unexplained, stale


def markdown(by_file: dict[str, list[Case]], torch_release: tuple[int, int], device: str) -> str:
    lines = []
    for name, cases in by_file.items():
        counts = {o: sum(c.outcome == o for c in cases) for o in ("passed", "failed", "error", "skipped")}
        lines += [f"### `{name}`: " + ", ".join(f"{n} {o}" for o, n in counts.items() if n), "",
                  "| test | outcome | why it cannot pass on the emulator (a failure), or the skip reason |",
                  "|---|---|---|"]
        for c in cases:
            why = expected_failure(c.id, torch_release, device) if c.outcome in ("failed", "error") else None
            note = why or (c.message if c.outcome != "passed" else "")
            lines.append(f"| `{c.id}` | {c.outcome} | {note.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def run(tests_dir: Path, out: Path, torch_release: str | None, device: str | None) -> dict[str, Path]:
    """Run each suite file present under ``tests_dir`` on the emulator; returns its JUnit XML per file."""
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, devices in SUITES.items():
        path = tests_dir / name
        if not path.is_file():
            print(f"{name}: not in {tests_dir}, skipped", file=sys.stderr)
            continue
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_XPU_EMULATOR", "ZE_"))}
        env.update(LIGHTNING_XPU_EMULATOR=str(devices), PYTHONWARNINGS="ignore")
        for key, value in (("LIGHTNING_XPU_EMULATOR_CACHE", os.environ.get("LIGHTNING_XPU_EMULATOR_CACHE")),
                           ("LIGHTNING_XPU_EMULATOR_TORCH", torch_release),
                           ("LIGHTNING_XPU_EMULATOR_DEVICE", device)):
            if value:
                env[key] = value
        xml = out / (name.replace("/", "__") + ".xml")
        cmd = [sys.executable, "-m", "pytest", path.name, "-p", "no:cacheprovider", "-q", f"--junitxml={xml}"]
        print("$ " + " ".join(cmd), f"(in {path.parent})", file=sys.stderr)
        subprocess.run(cmd, cwd=path.parent, env=env, check=False)
        results[name] = xml
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("run", "report"):
        p = sub.add_parser(command)
        if command == "run":
            p.add_argument("tests_dir", type=Path, help="a directory laid out as PyTorch's test/")
        p.add_argument("out", type=Path, help="where the JUnit XML files go (run) or are (report)")
        p.add_argument("--torch", default=None, help="LIGHTNING_XPU_EMULATOR_TORCH (default: the running torch's)")
        p.add_argument("--device", default=None, help="LIGHTNING_XPU_EMULATOR_DEVICE (default: max1550)")
        p.add_argument("--markdown", type=Path, default=None, help="write the per-test table here")
    args = parser.parse_args(argv)
    if args.command == "run":
        xmls = run(args.tests_dir, args.out, args.torch, args.device)
    else:
        xmls = {name: args.out / (name.replace("/", "__") + ".xml") for name in SUITES}
    torch_release = release(args.torch or importlib.metadata.version("torch"))
    by_file = {name: read_cases(xml) for name, xml in xmls.items() if xml.is_file()}
    if not by_file:
        print("no results: no suite file ran", file=sys.stderr)
        return 1
    if args.markdown:
        args.markdown.write_text(markdown(by_file, torch_release, args.device or "max1550"))
    unexplained, stale = check([c for cases in by_file.values() for c in cases], torch_release,
                               args.device or "max1550")
    for name, cases in by_file.items():
        counts = {o: sum(c.outcome == o for c in cases) for o in ("passed", "failed", "error", "skipped")}
        print(f"{name}: " + ", ".join(f"{n} {o}" for o, n in counts.items()))
    for line in unexplained:
        print(f"UNEXPLAINED FAILURE {line}")
    for line in stale:
        print(f"STALE EXPLANATION {line}")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
