#!/usr/bin/env bash
# The README's main job on a fresh machine: install the lightning-xpu tool, build and install the patched
# Lightning, check the setup with `lightning-xpu doctor`, then train a small model on xpu with bf16-mixed on one
# device and with DDP on two. On a machine without an Intel GPU it uses the emulated XPU (LIGHTNING_XPU_EMULATOR=2)
# and says so; it never trains on the CPU instead.
#
#   bash ci/main-job.sh                       # CPU-only machine: torch==2.13.0+cpu + the emulated XPU
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/xpu bash ci/main-job.sh   # Intel GPU machine: XPU torch
#
# The venv's torch is the one asked for: TORCH_INDEX_URL's, or torch==2.13.0+cpu without it. $venv/.lightning-xpu-torch
# records where the installed torch came from and its version; when either differs, torch is replaced.
#
# The CPU build comes from PyTorch's CPU index, an extra index beside PyPI (whose Linux torch is a CUDA build, which the
# emulator refuses), or from wherever this machine's pip configuration finds a `torch-2.13.0+cpu` wheel (find-links):
# the `+cpu` pin takes nothing else. Where the CPU index is unreachable, --retries 1 makes each lookup there fail at
# once (pip's default five retries add about 7 s of back-off for each package) with one WARNING line, and pip goes on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

unset LIGHTNING_XPU_EMULATOR  # this job decides: the real Intel GPUs where torch sees them, else emulated ones
venv="${LIGHTNING_XPU_VENV:-$PWD/.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pip() { "$py" -m pip --disable-pip-version-check --quiet "$@"; }

wanted="${TORCH_INDEX_URL:-torch==2.13.0+cpu}"
record="$venv/.lightning-xpu-torch"
# the installed torch's version from its metadata: importing torch before numpy is installed (Lightning's requirements
# bring it) would print torch's "Failed to initialize NumPy" warning
torch_version() { "$py" -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null; }
installed=$(torch_version || true)
if [ -z "$installed" ] || [ "$(cat "$record" 2>/dev/null)" != "$wanted $installed" ]; then
    if [ -n "$installed" ]; then
        echo "Replacing torch $installed in $venv with ${TORCH_INDEX_URL:+the build of }$wanted."
        pip uninstall -y torch
    fi
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
        pip install torch --index-url "$TORCH_INDEX_URL"
    else
        pip install --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu
    fi
    echo "$wanted $(torch_version)" > "$record"
fi
pip install ninja .
"$venv/bin/lightning-xpu" build --install

# The doctor's exit status is its verdict: 0 usable (real Intel GPUs), 3 emulated, 1 not usable (its last line says
# why and what to run next).
if "$py" -c "import sys, torch; sys.exit(0 if torch.xpu.is_available() else 1)"; then
    "$venv/bin/lightning-xpu" doctor
    devices=$("$py" -c "import torch; print(min(2, torch.xpu.device_count()))")
    echo "Training on ${devices} real Intel GPU(s)."
elif "$py" -c "import sys, torch; sys.exit(0 if torch.xpu._is_compiled() else 1)"; then
    "$venv/bin/lightning-xpu" doctor || true
    echo "torch is an XPU build but sees no Intel GPU: the doctor's verdict above says why. Not emulating instead." >&2
    exit 1
else
    export LIGHTNING_XPU_EMULATOR=2
    devices=2
    echo "No Intel GPU visible: training on 2 EMULATED XPU devices (LIGHTNING_XPU_EMULATOR=2)."
    status=0
    "$venv/bin/lightning-xpu" doctor || status=$?
    if [ "$status" -ne 3 ]; then
        echo "lightning-xpu doctor did not find the emulated XPUs usable (exit $status, 3 means emulated)." >&2
        exit 1
    fi
fi
"$py" examples/train_xpu.py --devices 1 --precision bf16-mixed
if [ "$devices" -ge 2 ]; then
    "$py" examples/train_xpu.py --devices 2 --strategy ddp --precision bf16-mixed
fi
