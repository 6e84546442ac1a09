"""The real-hardware tier: what Intel CI runs on a machine with Intel GPUs (and anyone can run by hand).

    ci/intel/install_torch.sh nightly          # or: release
    python ci/intel/run_xpu_tier.py [--out build/xpu-tier] [--min-devices 2]

Steps, each of which stops the run when it fails:

1. ``check_xpu.py``: a real XPU is visible (the emulator does not count). Without one the run stops here with
   ``no XPU visible``, before anything is built or installed.
2. ``lightning-xpu build --install``: the patched ``lightning``, ``pytorch-lightning`` and ``lightning-fabric`` wheels,
   installed against the torch already there.
3. ``lightning-xpu doctor``: the report of torch, devices, xccl and the installed Lightning (kept in ``doctor.txt``);
   all three import roots must be the patched wheels of this checkout's series.
4. ``lightning-xpu workspace``: a patched source tree, for the series' test files.
5. The XPU tests (``RUN_ONLY_XPU_TESTS=1``: every test marked ``RunIf(min_xpu_gpus=N)``) against the installed wheels,
   under each import root (``lightning.*``, and ``lightning_fabric`` / ``pytorch_lightning``), then the standalone
   (multi-process) ones, one process each. JUnit XML for each lands in the output directory.
6. A summary (``summary.md``, also appended to ``$GITHUB_STEP_SUMMARY``). The run fails when a test fails or when no XPU
   test executed at all: skipping everything is not a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ci.junit import read_cases, summary  # noqa: E402
from lightning_xpu.series import load_series  # noqa: E402

RUNNER = REPO / "tests" / "series" / "run.py"
CHECK = Path(__file__).resolve().parent / "check_xpu.py"
SERIES = REPO / "patches"  # this checkout's series, whichever lightning_xpu is installed


class StepFailed(Exception):
    """A step of the tier failed; the message says which and why."""


def step(title: str, cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> None:
    """Run one step from the repository root, echoing its output (and keeping it in ``log``)."""
    print(f"\n=== {title}: {' '.join(cmd)}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout, end="", flush=True)
    if log is not None:
        log.write_text(proc.stdout)
    print(f"=== {title}: exit {proc.returncode} after {time.monotonic() - start:.0f}s", flush=True)
    if proc.returncode != 0:
        raise StepFailed(f"{title} failed (exit {proc.returncode})")


def check_installed(expected: int) -> None:
    """All three import roots must be the patched wheels of this series: never test an unpatched Lightning."""
    proc = subprocess.run([sys.executable, "-m", "lightning_xpu", "doctor", "--json"], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise StepFailed(f"`lightning-xpu doctor --json` failed: {proc.stderr.strip()}")
    rows = json.loads(proc.stdout)["lightning"]
    wrong = [f"{r['root']} ({r.get('version', 'not installed')})" for r in rows
             if not r["installed"] or r.get("series_version") != expected]
    if wrong:
        raise StepFailed(f"the installed Lightning is not this series (xpu.{expected}): {', '.join(wrong)}")
    print(f"=== installed: {', '.join(r['root'] + ' ' + r['version'] for r in rows)}", flush=True)


def tier_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RUN_ONLY_CUDA_TESTS", "PL_RUN_STANDALONE_TESTS")}
    env["RUN_ONLY_XPU_TESTS"] = "1"
    return env


def summarize(out: Path) -> tuple[str, bool]:
    """A Markdown summary of every JUnit file in ``out`` and whether the tier passed."""
    lines = ["| run | result |", "|---|---|"]
    executed, broken, skipped = 0, [], Counter()
    groups: dict[str, list] = {}
    for xml in sorted(out.glob("junit-*.xml")):
        group = xml.name.removeprefix("junit-").split(".")[0]  # standalone nodes write junit-ROOT-standalone.N.xml
        groups.setdefault(group, []).extend(read_cases(xml))
    for group, cases in groups.items():
        lines.append(f"| {group} | {summary(cases)} |")
        executed += sum(c.outcome in ("passed", "failed", "error") for c in cases)
        broken += [f"{group}: {c.id}: {c.message}" for c in cases if c.outcome in ("failed", "error")]
        skipped.update(c.message for c in cases if c.outcome == "skipped")
    ok = executed > 0 and not broken
    verdict = "PASSED" if ok else ("FAILED: no XPU test executed (everything skipped or nothing collected)"
                                   if executed == 0 else f"FAILED: {len(broken)} test(s) failed")
    lines = [f"## XPU tier: {verdict}", "", f"{executed} XPU test(s) executed.", "", *lines]
    if broken:
        lines += ["", "### Failed", *(f"- `{b}`" for b in broken)]
    if skipped:
        lines += ["", "### Skipped, by reason", *(f"- {n} x {reason}" for reason, n in skipped.most_common())]
    return "\n".join(lines) + "\n", ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "xpu-tier", help="results directory")
    parser.add_argument("--min-devices", type=int, default=1, help="fail unless this many XPUs are visible")
    parser.add_argument("--skip-build", action="store_true", help="test the Lightning already installed here")
    parser.add_argument("--import-root", choices=("lightning", "standalone"), action="append", dest="roots",
                        help="import roots to test (default: both)")
    ns = parser.parse_args(argv)
    out = ns.out.resolve()
    roots = ns.roots or ["lightning", "standalone"]
    py = sys.executable

    try:
        step("XPU check", [py, str(CHECK), "--min-devices", str(ns.min_devices)])
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("junit-*.xml"):
            stale.unlink()
        if not ns.skip_build:
            step("build and install", [py, "-m", "lightning_xpu", "build", "--install", "--series", str(SERIES),
                                       "--dist", str(out / "dist")])
        step("doctor", [py, "-m", "lightning_xpu", "doctor"], log=out / "doctor.txt")
        check_installed(len(load_series(SERIES).patches))
        tree = out / "tree"
        shutil.rmtree(tree, ignore_errors=True)  # never test a tree left from another series
        step("patched tree", [py, "-m", "lightning_xpu", "workspace", "--series", str(SERIES), str(tree)])
        failures = []
        for root in roots:
            for standalone in (False, True):
                name = f"{root}-standalone" if standalone else root
                cmd = [py, str(RUNNER), "--tree", str(tree), "--import-root", root,
                       *(["--standalone"] if standalone else []),
                       "--", "-v", "-rs", "-p", "no:randomly", f"--junitxml={out / f'junit-{name}.xml'}"]
                try:
                    step(f"XPU tests ({name})", cmd, env=tier_env())
                except StepFailed as err:
                    failures.append(str(err))  # run the other groups too; the summary names the failed tests
    except StepFailed as err:
        print(f"\nERROR: {err}; the XPU tier did not run", file=sys.stderr)
        return 1

    text, ok = summarize(out)
    (out / "summary.md").write_text(text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as fh:
            fh.write(text)
    print("\n" + text)
    if failures and ok:  # pytest failed without a failing test case, e.g. a collection error
        print("ERROR: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
