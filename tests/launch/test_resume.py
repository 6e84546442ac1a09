"""Lightning's own resume, which the kill-and-resume tests build on, on an emulated XPU and on the CPU.

A run with ``max_steps`` resumed from the checkpoint ``ModelCheckpoint(every_n_epochs=1, save_last=True)`` wrote at
the end of an epoch (no validation) restarts in the finished epoch at batch index N and trains one batch too many,
on every device, in stock Lightning 2.6.6: its fit loop forces ``restarting`` for every iteration-based run
(``FitLoop.restarting``), so it never takes the "resumed on epoch end" path that runs with ``max_epochs`` take. The
series' patch 19 (``pytorch: resume max_steps runs in the next epoch after an epoch end``) fixes it for every device:
here the resumed run trains what the uninterrupted run trained after the checkpoint, on the XPU as on the CPU.

The kill-and-resume tests of the launch and Slurm tiers train with ``max_epochs``, which Lightning resumes correctly.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("resume_max_steps.py")


@pytest.fixture(scope="module")
def runs() -> dict:
    env = dict(os.environ, LIGHTNING_XPU_EMULATOR="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_xpu_resumes_as_the_cpu_does(runs):
    assert runs["xpu"]["resumed"]["devices"] == ["xpu:0"]
    assert runs["cpu"]["resumed"]["devices"] == ["cpu"]
    for run in ("uninterrupted", "resumed"):
        assert runs["xpu"][run]["batches"] == runs["cpu"][run]["batches"]
        assert runs["xpu"][run]["weights"] == runs["cpu"][run]["weights"]


@pytest.mark.parametrize("device", ["cpu", "xpu"])
def test_resume_from_epoch_end_with_max_steps_trains_like_an_uninterrupted_run(runs, device):
    uninterrupted, resumed = runs[device]["uninterrupted"], runs[device]["resumed"]
    # the second epoch, whole: what the uninterrupted run trained after the checkpoint of the first
    assert resumed["batches"] == uninterrupted["batches"][4:] == [[1, i] for i in range(4)]
    assert resumed["weights"] == uninterrupted["weights"]
