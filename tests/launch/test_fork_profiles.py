"""Fork-based strategies on two emulated XPUs under the emulator's torch version profiles.

Whether a forked process can use the XPU depends on how torch counted the devices: torch 2.8-2.12, and 2.13+ without
the ``pyzes`` package, count them through the runtime, which poisons every later fork; 2.13+ with ``pyzes`` counts them
without. ``Trainer(accelerator="auto", strategy="ddp_notebook", devices=2)`` and ``Fabric(accelerator="auto",
strategy="ddp_fork", devices=2)`` must then either train or fail at construction with an error that says what to do,
never crash inside a worker (``fork_two_xpus.py`` runs each in a fresh process under the profile).

Run by ``tox -e launch`` (patched Lightning installed); by hand: ``lightning-xpu build --install && pytest
tests/launch/test_fork_profiles.py -p no:xdist``.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("fork_two_xpus.py")
TIMEOUT = 240

_REFUSALS = {
    "trainer": ("MisconfigurationException", "Forked processes can't use the XPU here"),
    "fabric": ("ValueError", "Forked processes can't use the XPU here"),
}


def _run(api: str, torch_release: str, pyzes: str, out: Path) -> dict:
    env = dict(os.environ)
    env.update(
        LIGHTNING_XPU_EMULATOR="2",
        LIGHTNING_XPU_EMULATOR_TORCH=torch_release,
        LIGHTNING_XPU_EMULATOR_PYZES=pyzes,
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), api, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{api} on torch {torch_release}, pyzes={pyzes}: no result in {TIMEOUT} s:\n{stderr[-4000:]}")
    assert "Cannot re-initialize XPU in forked subprocess" not in stdout + stderr, stderr[-4000:]
    assert proc.returncode == 0, f"rc={proc.returncode}\n{stdout}\n{stderr[-6000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("api", ["trainer", "fabric"])
@pytest.mark.parametrize(("torch_release", "pyzes"), [("2.8", "0"), ("2.13", "0")])
def test_refused_at_construction_without_a_fork_safe_count(tmp_path, api, torch_release, pyzes):
    result = _run(api, torch_release, pyzes, tmp_path / "out")
    error, message = _REFUSALS[api]
    assert result["outcome"] == "refused"
    assert result["error"] == error
    assert message in result["message"]
    assert "ddp_spawn" in result["message"]  # says what to do
    assert not list((tmp_path / "out").iterdir())  # no worker ran


@pytest.mark.parametrize("api", ["trainer", "fabric"])
def test_trains_with_the_level_zero_sysman_count(tmp_path, api):
    result = _run(api, "2.13", "1", tmp_path / "out")
    assert result["outcome"] == "trained"
    assert not result["xpu_initialized_here"]  # only the forked workers touched the XPU
    ranks = result["ranks"]
    assert [(r["rank"], r["device"], r["backend"]) for r in ranks] == [(0, "xpu:0", "xccl"), (1, "xpu:1", "xccl")]
    assert ranks[0]["weights"] == ranks[1]["weights"]
