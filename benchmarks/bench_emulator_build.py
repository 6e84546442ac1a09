#!/usr/bin/env python
"""Time a cold build of the emulator's native part (target: at most 90 s wall on 2 cores). Not a test.

Usage: python benchmarks/bench_emulator_build.py [--repeat N] [--per-source] [--json]

Each run builds into an empty temporary cache in a fresh process, as the first `import torch` under
LIGHTNING_XPU_EMULATOR or `python -m lightning_xpu.emulator --build` does, and reports its wall time and the CPU time
of the process and its compilers. `--per-source` compiles every source as a translation unit of its own (the build
before the sources were grouped into units), for a comparison under the same load. The load average is printed
before and after each run: on a shared machine, compare runs only at a similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 90.0
_BUILD = "from lightning_xpu.emulator import _build\n{patch}print(_build.build())\n"
_PER_SOURCE = "_build._UNITS = tuple((name, (name,)) for _, names in _build._UNITS for name in names)\n"


def _run(per_source: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-emulator-build-") as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_XPU_EMULATOR")}
        env.update(LIGHTNING_XPU_EMULATOR_CACHE=cache,
                   PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
        code = _BUILD.format(patch=_PER_SOURCE if per_source else "")
        load_before = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"bench_emulator_build: the build failed:\n{proc.stderr[-4000:]}")
    return {"wall_s": wall, "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed cold builds (default 3)")
    parser.add_argument("--per-source", action="store_true", help="one translation unit per source (the old build)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    import torch

    runs = [_run(args.per_source) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["wall_s"])
    units = "per-source" if args.per_source else "grouped"
    result = {"torch": torch.__version__, "cpus": os.cpu_count(), "units": units,
              "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs], "best_wall_s": round(best["wall_s"], 2),
              "target_s": TARGET_S, "within_target": best["wall_s"] <= TARGET_S}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"cold emulator build, torch {torch.__version__}, {result['units']} units; cpus: {os.cpu_count()}")
    for i, run in enumerate(runs, 1):
        print(f"run {i}: wall {run['wall_s']:.1f} s, CPU {run['user_s'] + run['sys_s']:.1f} s "
              f"(user {run['user_s']:.1f} + sys {run['sys_s']:.1f}); load average {run['load_before']:.2f} before, "
              f"{run['load_after']:.2f} after")
    verdict = "within" if result["within_target"] else "OVER"
    print(f"best: {best['wall_s']:.1f} s wall ({verdict} the {TARGET_S:.0f} s target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
