#!/usr/bin/env bash
# The README's main job on a fresh machine: install the lightning-xpu tool, build and install the patched
# Lightning, check the setup with `lightning-xpu doctor`, then train a small model on xpu with bf16-mixed on one
# device and with DDP on two. On a machine without an Intel GPU it uses the emulated XPU (LIGHTNING_XPU_EMULATOR=2)
# and says so; it never trains on the CPU instead.
#
#   bash ci/main-job.sh                       # CPU-only machine: torch==2.13.0 (CPU build) + the emulated XPU
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/xpu bash ci/main-job.sh   # Intel GPU machine: XPU torch
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv="${LIGHTNING_XPU_VENV:-$PWD/.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip() { "$py" -m pip --disable-pip-version-check --quiet "$@"; }

if ! "$py" -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        pip install torch --index-url "$TORCH_INDEX_URL"
    else
        pip install torch==2.13.0
    fi
fi
pip install ninja .
"$venv/bin/lightning-xpu" build --install
"$venv/bin/lightning-xpu" doctor

if "$py" -c "import sys, torch; sys.exit(0 if torch.xpu.is_available() else 1)"; then
    devices=$("$py" -c "import torch; print(min(2, torch.xpu.device_count()))")
    echo "Training on ${devices} real Intel GPU(s)."
else
    export LIGHTNING_XPU_EMULATOR=2
    devices=2
    echo "No Intel GPU visible: training on 2 EMULATED XPU devices (LIGHTNING_XPU_EMULATOR=2)."
    "$py" -m lightning_xpu.emulator
fi
"$py" examples/train_xpu.py --devices 1 --precision bf16-mixed
if [ "$devices" -ge 2 ]; then
    "$py" examples/train_xpu.py --devices 2 --strategy ddp --precision bf16-mixed
fi
