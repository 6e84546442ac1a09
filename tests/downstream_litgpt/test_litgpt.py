"""LitGPT's ``pretrain`` with its default ``torch.compile`` (inductor) on one and two XPUs, against the patched wheels.

``tox -e downstream-litgpt`` runs it on emulated XPUs (LIGHTNING_XPU_EMULATOR=2), where inductor writes C++ kernels
for xpu instead of Triton ones (docs/emulator.md says what that proves). Two devices make LitGPT pick FSDP
(``HYBRID_SHARD``), over ``xccl``. Anywhere else (a plain ``pytest tests``) the module skips, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("litgpt") is None or os.environ.get("LIGHTNING_DOWNSTREAM_BUILD") != "patched":
    pytest.skip(
        "LitGPT's tier needs litgpt and the patched wheels installed: tox -e downstream-litgpt runs it",
        allow_module_level=True,
    )

SCRIPT = Path(__file__).parent / "pretrain_tiny.py"


@pytest.mark.parametrize("devices", [1, 2])
def test_pretrain_with_default_compile(devices, tmp_path):
    import torch

    assert torch.xpu.device_count() >= devices, "run with LIGHTNING_XPU_EMULATOR=2 or on two Intel GPUs"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "tiny", "--out_dir", str(tmp_path / "out"), "--devices", str(devices)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    results = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("rank-result")]
    assert sorted(r["rank"] for r in results) == list(range(devices))
    for r in results:
        assert r["max_memory_allocated"] > 0  # the model and batches were on the XPU
        assert r["graphs"] >= 1
        # inductor compiled (or took from its cache) the training graphs: the default backend, not aot_eager
        assert r["inductor"].get("fxgraph_cache_miss", 0) + r["inductor"].get("fxgraph_cache_hit", 0) >= 2
    logged = [line for line in proc.stdout.splitlines() if "loss train:" in line]
    losses = [float(line.split("loss train: ")[1].split(",")[0]) for line in logged]
    assert len(losses) == 4, proc.stdout[-4000:]
    assert all(loss == loss and loss < 10 for loss in losses)  # finite, about ln(128) at the start
    assert (tmp_path / "out" / "final" / "lit_model.pth").is_file()
