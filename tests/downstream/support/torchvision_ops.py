"""Make torchvision importable beside the CPU build of torch when its C++ extension cannot load.

PyPI's torchvision wheels for Linux are CUDA builds: their ``_C`` extension links ``libtorch_cuda.so``, which the CPU
build of torch (the one the emulated XPU runs on) does not ship. torchvision survives that at import, except for its
fake-tensor registrations of ``torchvision::nms`` and ``torchvision::qnms``, which need the operators to exist:
``import torchvision`` fails with ``operator torchvision::nms does not exist``.

:func:`define_missing_operators` declares torchvision's operators with their schemas, as its extension would, each
with a kernel that raises ``NotImplementedError`` naming the operator and why. torchvision itself still reports that its
extension did not load (``torchvision.extension._has_ops()`` is false), so its Python wrappers (``torchvision.ops.nms``,
``roi_pool``, ...) raise their own error, and those with a pure-Python path take it as they do on any build without
the extension. Nothing here implements an operator.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch

TORCHVISION_VERSION = "0.28.0"

# The operators torchvision 0.28.0's `_C` extension defines (torchvision/csrc/ops/*.cpp, TORCH_LIBRARY_FRAGMENT).
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) "
    "-> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)

# A torch.library.Library drops its registrations when it is garbage collected: keep it for the process's lifetime,
# with the reason the extension did not load.
_library: torch.library.Library | None = None
_reason: str | None = None


def operator_names() -> list[str]:
    """The names of the operators in :data:`SCHEMAS`."""
    return [schema.split("(", 1)[0] for schema in SCHEMAS]


def extension_load_error() -> str | None:
    """Why torchvision's ``_C`` extension does not load on this torch, or None when it does (without importing it)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise RuntimeError("torchvision is not installed: install torchvision==" + TORCHVISION_VERSION)
    candidates = sorted(Path(spec.origin).parent.glob("_C.*so"))
    if not candidates:
        return f"torchvision has no _C extension in {Path(spec.origin).parent}"
    try:
        torch.ops.load_library(str(candidates[0]))
    except OSError as error:
        # torch's "Could not load this library: PATH" carries the loader's own message as its cause
        return str(error.__cause__ or error)
    return None


def define_missing_operators() -> str | None:
    """Declare torchvision's operators where its extension cannot load; return why it cannot, or None if it loads
    (then there is nothing to declare, whatever torchvision's version).

    Call it before anything imports torchvision. Calling it again does nothing more.
    """
    global _library, _reason
    if _library is not None:
        return _reason
    reason = extension_load_error()
    if reason is None:
        return None
    installed = importlib.metadata.version("torchvision").split("+", 1)[0]
    if installed != TORCHVISION_VERSION:
        raise RuntimeError(
            f"tests/downstream/support/torchvision_ops.py declares torchvision {TORCHVISION_VERSION}'s operators, "
            f"but torchvision {installed} is installed: install torchvision=={TORCHVISION_VERSION} or update SCHEMAS"
        )
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema, name in zip(SCHEMAS, operator_names(), strict=True):
        library.define(schema)
        library.impl(name, _unavailable(name, reason), "CompositeExplicitAutograd")
    _library, _reason = library, reason
    return reason


def _unavailable(name: str, reason: str) -> Callable[..., NoReturn]:
    def kernel(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"torchvision::{name} cannot run here: torchvision's C++ extension did not load on torch "
            f"{torch.__version__} ({reason}). PyPI's torchvision for Linux is a CUDA build; on the CPU build of "
            "torch only torchvision's pure-Python code runs. Run this on a torchvision built for this torch."
        )

    return kernel
