#!/usr/bin/env bash
# Install PyTorch's XPU wheels into the current Python environment, for the real-hardware tier on Intel GPUs.
#
#   ci/intel/install_torch.sh nightly   # --pre torch from https://download.pytorch.org/whl/nightly/xpu
#   ci/intel/install_torch.sh release   # the latest release from https://download.pytorch.org/whl/xpu
#   ci/intel/install_torch.sh floor     # the series' XPU floor, torch 2.8 (its newest patch release), same index
#
# Only torch (and what its XPU wheel depends on, e.g. pytorch-triton-xpu) comes from PyTorch's index; everything
# else comes from PyPI later, constrained to this torch by `lightning-xpu build --install`.
set -euo pipefail

channel="${1:-}"
case "$channel" in
  nightly) index="https://download.pytorch.org/whl/nightly/xpu"; pre=(--pre) ;;
  release|floor) index="https://download.pytorch.org/whl/xpu"; pre=() ;;
  *) echo "usage: $0 nightly|release|floor" >&2; exit 2 ;;
esac
# the oldest torch the series supports on XPU (xccl exists from 2.8); keep in step with the README's torch range
spec=torch
[ "$channel" = floor ] && spec="torch==2.8.*"

python="${PYTHON:-python}"
echo "installing torch ($channel) from $index"
"$python" -m pip install --upgrade --disable-pip-version-check "${pre[@]}" "$spec" --index-url "$index"

# a CPU or CUDA torch here would make every later step meaningless: refuse it now
"$python" - <<'PY'
import sys

import torch

xpu = getattr(torch.version, "xpu", None)
print(f"installed torch {torch.__version__} (XPU runtime: {xpu})")
if xpu is None:
    sys.exit(f"ERROR: torch {torch.__version__} is not an XPU build (torch.version.xpu is None)")
PY
