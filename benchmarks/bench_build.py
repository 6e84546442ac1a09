#!/usr/bin/env python
"""Time `apply` + building the three patched wheels (target: at most 60 s on 2 cores). Not a test.

Usage: python benchmarks/bench_build.py [--series DIR] [--repeat N] [--json]

The pinned sdists must be cached (or downloadable) first; download time is reported separately and
excluded from the build figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_xpu.apply import apply_to_tree  # noqa: E402
from lightning_xpu.base import LIGHTNING, base_trees, load_base  # noqa: E402
from lightning_xpu.series import find_series_dir, load_series  # noqa: E402
from lightning_xpu.wheels import build  # noqa: E402

TARGET_S = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=Path, help="series directory (default: the checkout's patches/)")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    directory = find_series_dir(args.series)
    series, base = load_series(directory), load_base(directory)
    start = time.perf_counter()
    trees = base_trees(base)
    fetch_s = time.perf_counter() - start

    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="bench-lightning-xpu-") as tmp:
            target = Path(tmp) / "lightning"
            shutil.copytree(trees[LIGHTNING], target, symlinks=True)
            t0 = time.perf_counter()
            apply_to_tree(series, target)
            t1 = time.perf_counter()
            build(series, base, Path(tmp) / "dist", reuse=False)  # time a build, not the cache
            t2 = time.perf_counter()
            runs.append({"apply_s": t1 - t0, "build_s": t2 - t1, "total_s": t2 - t0})
    best = min(runs, key=lambda r: r["total_s"])
    result = {"patches": series.version, "cpus": os.cpu_count(), "fetch_or_cache_s": round(fetch_s, 3),
              "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
              "best_total_s": round(best["total_s"], 3), "target_s": TARGET_S,
              "within_target": best["total_s"] <= TARGET_S}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"series: {series.version} patches; cpus: {os.cpu_count()}; sdists ready in {fetch_s:.2f} s")
        for i, run in enumerate(runs, 1):
            print(f"run {i}: apply {run['apply_s']:.2f} s + build 3 wheels {run['build_s']:.2f} s "
                  f"= {run['total_s']:.2f} s")
        verdict = "within" if result["within_target"] else "OVER"
        print(f"best: {best['total_s']:.2f} s ({verdict} the {TARGET_S:.0f} s target)")
    return 0


if __name__ == "__main__":
    from lightning_xpu.errors import ToolError

    try:
        sys.exit(main())
    except ToolError as err:
        sys.exit(f"bench_build: error: {err}")
