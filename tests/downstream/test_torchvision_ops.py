"""torchvision beside the CPU build of torch: what imports, what runs and what cannot, on the CPU and an XPU.

PyPI's torchvision 0.28.0 is a CUDA build whose C++ extensions do not load on the CPU torch. With the operators declared
by ``support/torchvision_ops.py`` (conftest does it before anything imports torchvision) the package imports; its
pure-Python parts run, and what needs its C++ kernels raises. The lists here are the ones docs/own-xpu-accelerator.md
gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from tests.downstream.support import torchvision_ops
from tests.downstream.support.selection import skip_unless_selected

skip_unless_selected()

if torchvision_ops.define_missing_operators() is None:
    pytest.skip(
        "torchvision's C++ extension loads on this torch (a torchvision built for it): these tests are about the CPU "
        "build of torch beside PyPI's CUDA torchvision, which the emulated downstream tier (tox -e downstream) runs",
        allow_module_level=True,
    )

NO_OPS = re.escape("Couldn't load custom C++ ops")
NO_IMAGE_OPS = "Couldn't load the image extension"


def test_extension_does_not_load_on_the_cpu_torch() -> None:
    import torchvision

    reason = torchvision_ops.define_missing_operators()
    assert reason is not None and "cuda" in reason, reason
    assert not torchvision.extension._has_ops()


def _arguments(schema: str) -> list[object]:
    """A value of each argument's type, to call an operator through its schema."""
    samples = {"Tensor": torch.zeros(1, 5), "float": 1.0, "int": 1, "SymInt": 1, "bool": False}
    return [samples[str(argument.type)] for argument in torch._C.parse_schema(f"torchvision::{schema}").arguments]


@pytest.mark.parametrize("schema", torchvision_ops.SCHEMAS, ids=torchvision_ops.operator_names())
def test_declared_operator_raises_naming_itself(schema: str) -> None:
    import torchvision  # noqa: F401

    name = schema.split("(", 1)[0]
    with pytest.raises(NotImplementedError, match=f"torchvision::{name} cannot run here: .*CUDA build"):
        getattr(torch.ops.torchvision, name)(*_arguments(schema))


def _boxes(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0]], device=device)
    return boxes, torch.tensor([0.9, 0.8], device=device)


def _features(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(1, 4, 8, 8, device=device), torch.tensor([[0.0, 0.0, 0.0, 4.0, 4.0]], device=device)


def _nms(device: str) -> object:
    from torchvision.ops import nms

    return nms(*_boxes(device), 0.5)


def _batched_nms(device: str) -> object:
    from torchvision.ops import batched_nms

    return batched_nms(*_boxes(device), torch.tensor([0, 1], device=device), 0.5)


def _box_iou_rotated(device: str) -> object:
    from torchvision.ops import box_iou

    boxes = torch.tensor([[5.0, 5.0, 10.0, 10.0, 0.0]], device=device)
    return box_iou(boxes, boxes, fmt="cxcywhr")


def _roi_align(device: str) -> object:
    from torchvision.ops import roi_align

    return roi_align(*_features(device), 2)


def _multi_scale_roi_align(device: str) -> object:
    from torchvision.ops import MultiScaleRoIAlign

    features, rois = _features(device)
    return MultiScaleRoIAlign(["0"], 2, 2)({"0": features}, [rois[:, 1:]], [(8, 8)])


def _roi_pool(device: str) -> object:
    from torchvision.ops import roi_pool

    return roi_pool(*_features(device), 2)


def _ps_roi_align(device: str) -> object:
    from torchvision.ops import ps_roi_align

    return ps_roi_align(*_features(device), 2)


def _ps_roi_pool(device: str) -> object:
    from torchvision.ops import ps_roi_pool

    return ps_roi_pool(*_features(device), 2)


def _deform_conv2d(device: str) -> object:
    from torchvision.ops import deform_conv2d

    features, _ = _features(device)
    weight = torch.rand(2, 4, 3, 3, device=device)
    return deform_conv2d(features, torch.zeros(1, 18, 6, 6, device=device), weight)


def _box_iou(device: str) -> object:
    from torchvision.ops import box_iou

    boxes, _ = _boxes(device)
    return box_iou(boxes, boxes)


def _resnet18(device: str) -> object:
    from torchvision.models import resnet18

    return resnet18().eval().to(device)(torch.rand(1, 3, 32, 32, device=device))


def _resize(device: str) -> object:
    from torchvision.transforms import v2

    return v2.Resize(16, antialias=True)(torch.rand(3, 32, 32, device=device))


NEED_THE_EXTENSION: dict[str, Callable[[str], object]] = {
    "nms": _nms,
    "batched_nms": _batched_nms,
    "box_iou(fmt=cxcywhr)": _box_iou_rotated,
    "roi_pool": _roi_pool,
    "ps_roi_align": _ps_roi_align,
    "ps_roi_pool": _ps_roi_pool,
    "deform_conv2d": _deform_conv2d,
}
# torchvision's pure-Python roi_align runs through torch.compile, only where torch.compile supports the device: on an
# XPU that needs Triton, which no CPU build of torch has
NEED_TRITON_ON_XPU: dict[str, Callable[[str], object]] = {
    "roi_align": _roi_align,
    "MultiScaleRoIAlign": _multi_scale_roi_align,
}
PURE_PYTHON: dict[str, Callable[[str], object]] = {
    "box_iou": _box_iou,
    "models.resnet18": _resnet18,
    "transforms.v2.Resize": _resize,
}


@pytest.mark.parametrize("device", ["cpu", "xpu"])
@pytest.mark.parametrize("name", NEED_THE_EXTENSION)
def test_cannot_run_without_the_extension(name: str, device: str) -> None:
    with pytest.raises(RuntimeError, match=NO_OPS):
        NEED_THE_EXTENSION[name](device)


@pytest.mark.parametrize("name", NEED_TRITON_ON_XPU)
def test_cannot_run_on_xpu_without_triton(name: str) -> None:
    with pytest.raises(RuntimeError, match=NO_OPS):
        NEED_TRITON_ON_XPU[name]("xpu")


def test_roi_align_compiles_on_the_cpu() -> None:
    """The same roi_align runs on the CPU, compiled by torch.compile on its first call (the slow part of this test)."""
    pooled = _roi_align("cpu")
    assert isinstance(pooled, torch.Tensor) and pooled.shape == (1, 4, 2, 2)


@pytest.mark.parametrize("device", ["cpu", "xpu"])
@pytest.mark.parametrize("name", PURE_PYTHON)
def test_pure_python_runs(name: str, device: str) -> None:
    result = PURE_PYTHON[name](device)
    assert isinstance(result, torch.Tensor) and result.device.type == device


@pytest.mark.parametrize("decoder", ["decode_image", "decode_jpeg", "decode_png", "decode_gif", "decode_webp"])
def test_image_decoding_cannot_run(decoder: str) -> None:
    import torchvision.io

    with pytest.raises(RuntimeError, match=NO_IMAGE_OPS):
        getattr(torchvision.io, decoder)(torch.zeros(16, dtype=torch.uint8))


def test_torchvision_version_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The declared schemas are torchvision 0.28.0's: another version is refused, not guessed at."""
    monkeypatch.setattr(torchvision_ops, "_library", None)
    monkeypatch.setattr(torchvision_ops.importlib.metadata, "version", lambda name: "0.29.1")
    with pytest.raises(RuntimeError, match="torchvision 0.29.1 is installed: install torchvision==0.28.0"):
        torchvision_ops.define_missing_operators()
