"""The real-hardware tier: what Intel CI runs on a machine with Intel GPUs (and anyone can run by hand).

    ci/intel/install_torch.sh nightly          # or: release, floor (torch 2.8, the oldest the series supports on XPU)
    python ci/intel/run_xpu_tier.py [--out build/xpu-tier] [--min-devices 4] [-- PYTEST_ARGS]
    python ci/intel/run_xpu_tier.py --rehearse [N] [--test-list FILE]   # every step on N emulated XPUs (CPU torch)

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

``--rehearse`` runs the same steps with ``LIGHTNING_XPU_EMULATOR=N`` (default 4, what full coverage needs) on a CPU
build of torch, to check the tier itself. Everything it writes says so: the step titles, ``doctor.txt``, the JUnit
suite names (``xpu-tier-REHEARSAL-emulated-*``) and the summary's title. Its summary never reads as a hardware pass,
and without ``--rehearse`` the emulator is refused at step 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ci.intel.tier_summary import suite_name, summarize  # noqa: E402
from lightning_xpu.series import load_series  # noqa: E402
from lightning_xpu.verdict import EMULATED, EXIT_STATUS, USABLE  # noqa: E402

RUNNER = REPO / "tests" / "series" / "run.py"
CHECK = Path(__file__).resolve().parent / "check_xpu.py"
PLUGINS = Path(__file__).resolve().parent / "plugins"  # xpu_tier_ranks: one JUnit file per rank of a standalone test
SERIES = REPO / "patches"  # this checkout's series, whichever lightning_xpu is installed
FULL_COVERAGE_XPUS = 4  # the most any of the series' tests asks for: RunIf(min_xpu_gpus=4), the 2x2 device meshes
# a hung test (a collective that never completes) fails alone instead of holding the runner until the job's timeout
TEST_TIMEOUT_S = 900


class StepFailed(Exception):
    """A step of the tier failed; the message says which and why."""


class Tier:
    """One run of the tier: where it writes, its environment, its label and how long each step took."""

    def __init__(self, out: Path, emulated_xpus: int = 0) -> None:
        self.out = out
        self.emulated_xpus = emulated_xpus
        self.label = f"[REHEARSAL on {emulated_xpus} emulated XPUs] " if emulated_xpus else ""
        self.seconds: dict[str, float] = {}
        env = {k: v for k, v in os.environ.items() if k not in ("RUN_ONLY_CUDA_TESTS", "PL_RUN_STANDALONE_TESTS")}
        if emulated_xpus:
            inherited = env.get("LIGHTNING_XPU_EMULATOR", "0")
            if inherited not in ("", "0", str(emulated_xpus)):
                print(f"note: the rehearsal emulates {emulated_xpus} XPUs, not LIGHTNING_XPU_EMULATOR={inherited} "
                      "from the environment", flush=True)
            env["LIGHTNING_XPU_EMULATOR"] = str(emulated_xpus)
        self.env = env
        # what the emulator models (its device count, and a torch profile or device model where one is set)
        self.emulator_settings = " ".join(f"{k}={v}" for k, v in sorted(env.items())
                                          if k.startswith("LIGHTNING_XPU_EMULATOR") and not k.endswith("_CACHE"))

    def step(self, name: str, cmd: list[str], env: dict[str, str] | None = None, log: Path | None = None,
             expected_exit: int = 0) -> None:
        """Run one step from the repository root, echoing its output as it comes (and keeping it in ``log``)."""
        title = self.label + name
        print(f"\n=== {title}: {' '.join(cmd)}", flush=True)
        start = time.monotonic()
        lines = []
        with subprocess.Popen(cmd, cwd=REPO, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as proc:
            for line in proc.stdout:  # live: a job killed at its timeout still shows how far each step got
                print(line, end="", flush=True)
                lines.append(line)
        if log is not None:
            banner = (f"REHEARSAL on {self.emulated_xpus} emulated XPUs (LIGHTNING_XPU_EMULATOR={self.emulated_xpus}), "
                      "not a hardware run: nothing below describes an Intel GPU.\n\n" if self.emulated_xpus else "")
            log.write_text(banner + "".join(lines))
        self.seconds[name] = elapsed = time.monotonic() - start
        print(f"=== {title}: exit {proc.returncode} after {elapsed:.0f}s", flush=True)
        if proc.returncode != expected_exit:
            raise StepFailed(f"{title} failed (exit {proc.returncode}, expected {expected_exit})")

    def test_env(self) -> dict[str, str]:
        path = os.pathsep.join(filter(None, [str(PLUGINS), self.env.get("PYTHONPATH")]))
        return {**self.env, "RUN_ONLY_XPU_TESTS": "1", "PYTHONPATH": path}


def check_installed(expected: int, env: dict[str, str] | None = None) -> None:
    """All three import roots must be the patched wheels of this series: never test an unpatched Lightning."""
    proc = subprocess.run([sys.executable, "-m", "lightning_xpu", "doctor", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode not in EXIT_STATUS.values():  # each verdict has its status; the doctor step judged it
        raise StepFailed(f"`lightning-xpu doctor --json` failed: {proc.stderr.strip()}")
    rows = json.loads(proc.stdout)["lightning"]
    wrong = [f"{r['root']} ({r.get('version', 'not installed')})" for r in rows
             if not r["installed"] or r.get("series_version") != expected]
    if wrong:
        raise StepFailed(f"the installed Lightning is not this series (xpu.{expected}): {', '.join(wrong)}")
    print(f"=== installed: {', '.join(r['root'] + ' ' + r['version'] for r in rows)}", flush=True)


def read_test_list(path: Path) -> list[str]:
    """The pytest paths or node ids in ``path``, one a line; blank lines and ``#`` comments are ignored."""
    tests = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    tests = [t for t in tests if t]
    if not tests:
        raise StepFailed(f"{path} lists no tests")
    return tests


def run(tier: Tier, min_devices: int, roots: list[str], build: bool, pytest_args: list[str]) -> list[str]:
    """Steps 1-5; returns the test groups that failed (their tests are in the JUnit files)."""
    py, out = sys.executable, tier.out
    rehearse = ["--rehearse"] if tier.emulated_xpus else []
    tier.step("XPU check", [py, str(CHECK), *rehearse, "--min-devices", str(min_devices)])
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("junit-*.xml"):
        stale.unlink()
    if build:
        tier.step("build and install", [py, "-m", "lightning_xpu", "build", "--install", "--series", str(SERIES),
                                        "--dist", str(out / "dist")])
    # the doctor's verdict: "usable" on Intel GPUs, "emulated" in a rehearsal; anything else stops the tier
    verdict = EXIT_STATUS[EMULATED if tier.emulated_xpus else USABLE]
    tier.step("doctor", [py, "-m", "lightning_xpu", "doctor"], log=out / "doctor.txt", expected_exit=verdict)
    check_installed(len(load_series(SERIES).patches), tier.env)
    tree = out / "tree"
    shutil.rmtree(tree, ignore_errors=True)  # never test a tree left from another series
    tier.step("patched tree", [py, "-m", "lightning_xpu", "workspace", "--series", str(SERIES), str(tree)])
    failures = []
    for root in roots:
        for standalone in (False, True):
            name = f"{root}-standalone" if standalone else root
            # no -v for the standalone steps: run.py reads their node ids from pytest's quiet --collect-only output
            mode = ["--standalone", "--"] if standalone else ["--", "-v"]
            cmd = [py, str(RUNNER), "--tree", str(tree), "--import-root", root, *mode, "-rs", "-p", "no:randomly",
                   "-p", "xpu_tier_ranks", f"--timeout={TEST_TIMEOUT_S}", f"--junitxml={out / f'junit-{name}.xml'}",
                   f"--override-ini=junit_suite_name={suite_name(name, tier.emulated_xpus)}", *pytest_args]
            try:
                tier.step(f"XPU tests ({name})", cmd, env=tier.test_env())
            except StepFailed as err:
                failures.append(str(err))  # run the other groups too; the summary names the failed tests
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "xpu-tier", help="results directory")
    parser.add_argument("--min-devices", type=int, default=1, help="fail unless this many XPUs are visible")
    parser.add_argument("--skip-build", action="store_true", help="test the Lightning already installed here")
    parser.add_argument("--import-root", choices=("lightning", "standalone"), action="append", dest="roots",
                        help="import roots to test (default: both)")
    parser.add_argument("--rehearse", type=int, nargs="?", const=FULL_COVERAGE_XPUS, default=0, metavar="N",
                        help=f"rehearse every step on N emulated XPUs (default {FULL_COVERAGE_XPUS}), labelled as a "
                             "rehearsal everywhere; needs a CPU build of torch and lightning-xpu installed")
    parser.add_argument("--test-list", type=Path, metavar="FILE",
                        help="test only these (one pytest path or node id a line), in every test step")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest in every test step")
    ns = parser.parse_args(argv)
    if ns.rehearse < 0:
        parser.error("--rehearse N needs N >= 1 emulated XPUs")
    tier = Tier(ns.out.resolve(), ns.rehearse)
    try:
        tests = read_test_list(ns.test_list) if ns.test_list else []
        failures = run(tier, ns.min_devices, ns.roots or ["lightning", "standalone"], not ns.skip_build,
                       [*tests, *ns.pytest_args])
    except StepFailed as err:
        what = "the rehearsal of the XPU tier" if ns.rehearse else "the XPU tier"
        print(f"\nERROR: {err}; {what} did not run", file=sys.stderr)
        return 1

    text, ok = summarize(tier.out, tier.emulated_xpus, tier.seconds, failures, tier.emulator_settings)
    (tier.out / "summary.md").write_text(text)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as fh:
            fh.write(text)
    print("\n" + text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
