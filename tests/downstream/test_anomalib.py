"""anomalib 2.7.0's documented XPU paths, on an XPU: its Python API and its CLI train and test there.

anomalib ships its own ``XPUAccelerator`` (registered as "xpu" at import, without ``override``) and
``SingleXPUStrategy`` ("xpu_single"), and documents
``Engine(strategy=SingleXPUStrategy(), accelerator=XPUAccelerator())`` and
``anomalib train ... --trainer.accelerator xpu --trainer.strategy xpu_single``. With the patched Lightning those must
keep working, and Lightning's device-info log must say that the XPU is used.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.downstream.support.selection import skip_unless_selected

skip_unless_selected()

from tests.downstream.support.device_probe import DeviceProbe  # noqa: E402 (imports Lightning)

SUPPORT = Path(__file__).parent / "support"
IMAGE_SIZE = (64, 64)
USED = "GPU available: True (xpu), used: True"
NOT_USED = "GPU available but not used"
# Lightning 2.6.6 knows no Intel GPU: its device-info log does not look for one
CONTROL_LOG = "GPU available: False, used: False"


def fastflow() -> Any:
    """A small Fastflow whose resnet18 backbone starts untrained (no download)."""
    from anomalib.models import Fastflow

    return Fastflow(
        backbone="resnet18",
        pre_trained=False,
        flow_steps=2,
        pre_processor=Fastflow.configure_pre_processor(image_size=IMAGE_SIZE),
    )


def folder(root: Path) -> Any:
    from anomalib.data import Folder

    return Folder(
        name="synthetic",
        root=root,
        normal_dir="good",
        abnormal_dir="bad",
        mask_dir="mask",
        train_batch_size=4,
        eval_batch_size=4,
        num_workers=0,
        seed=0,
    )


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def assert_ran_on_xpu(probe: dict[str, Any]) -> None:
    """Training and testing ran, and every tensor the probe saw (batches, parameters, loss, optimizer state, test
    outputs) was on xpu:0."""
    assert probe["root_device"] == "xpu:0", probe
    assert probe["batches"]["train"] > 0 and probe["batches"]["test"] > 0, probe
    expected = {"train batch", "train parameters", "train loss", "optimizer state", "test parameters", "test outputs"}
    assert set(probe["devices"]) == expected, probe
    for what, devices in probe["devices"].items():
        assert devices == ["xpu:0"], f"{what} on {devices}"


def assert_device_log(build: str, log: str, warned: list[str]) -> None:
    if build == "patched":
        assert USED in log
        assert not [message for message in warned if NOT_USED in message], warned
    else:
        assert CONTROL_LOG in log


def test_engine_imports(lightning_build: str) -> None:
    """anomalib registers its accelerator and strategy at import, beside Lightning's own "xpu"."""
    from anomalib.engine import Engine, SingleXPUStrategy, XPUAccelerator  # noqa: F401
    from lightning.pytorch.strategies import StrategyRegistry

    assert StrategyRegistry["xpu_single"]["strategy"] is SingleXPUStrategy


class Run(NamedTuple):
    probe: DeviceProbe
    metrics: list[dict[str, float]]
    log: str
    warned: list[str]


def run_engine(tmp_path: Path, dataset: Path, **trainer: Any) -> Run:
    """``engine.train`` (fit, then test) on the synthetic folder, with what Lightning logged and warned meanwhile."""
    from anomalib.engine import Engine
    from lightning_utilities.core import rank_zero

    probe = DeviceProbe()
    engine = Engine(callbacks=[probe], logger=False, max_epochs=1, default_root_dir=tmp_path, **trainer)
    # Lightning's rank_zero_info writes to this logger (whichever of Lightning's packages was imported last sets it)
    collect = _Collect()
    rank_zero.log.addHandler(collect)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics = engine.train(model=fastflow(), datamodule=folder(dataset))
    finally:
        rank_zero.log.removeHandler(collect)
    return Run(probe, metrics, "\n".join(collect.messages), [str(warning.message) for warning in caught])


def test_documented_api(lightning_build: str, folder_dataset: Path, tmp_path: Path) -> None:
    """anomalib's documented path: its own accelerator instance and single-XPU strategy."""
    from anomalib.engine import SingleXPUStrategy, XPUAccelerator

    run = run_engine(tmp_path, folder_dataset, strategy=SingleXPUStrategy(), accelerator=XPUAccelerator())
    assert_ran_on_xpu(run.probe.as_dict())
    assert run.probe.accelerator == "anomalib.engine.accelerator.xpu.XPUAccelerator"
    assert "image_AUROC" in run.metrics[0], run.metrics
    assert_device_log(lightning_build, run.log, run.warned)


def test_accelerator_name(lightning_build: str, folder_dataset: Path, tmp_path: Path) -> None:
    """``Engine(accelerator="xpu")``, the way Lightning users ask for an XPU, with anomalib imported."""
    if lightning_build == "control":
        # what anomalib users get today: Lightning 2.6.6 resolves "xpu" to anomalib's class but, knowing no XPU, gives
        # it a single-device strategy on the CPU (hence anomalib's documented SingleXPUStrategy)
        with pytest.raises(RuntimeError, match="Device should be xpu, got cpu instead"):
            run_engine(tmp_path, folder_dataset, accelerator="xpu")
        return
    run = run_engine(tmp_path, folder_dataset, accelerator="xpu")
    assert_ran_on_xpu(run.probe.as_dict())
    assert "image_AUROC" in run.metrics[0], run.metrics
    assert_device_log(lightning_build, run.log, run.warned)


def test_cli(lightning_build: str, folder_dataset: Path, tmp_path: Path) -> None:
    """``anomalib train ... --trainer.accelerator xpu --trainer.strategy xpu_single``, its documented CLI path."""
    report = tmp_path / "probe.json"
    config = {
        "model": {
            "class_path": "anomalib.models.Fastflow",
            "init_args": {"backbone": "resnet18", "pre_trained": False, "flow_steps": 2},
        },
        "data": {
            "class_path": "anomalib.data.Folder",
            "init_args": {
                "name": "synthetic",
                "root": str(folder_dataset),
                "normal_dir": "good",
                "abnormal_dir": "bad",
                "mask_dir": "mask",
                "train_batch_size": 4,
                "eval_batch_size": 4,
                "num_workers": 0,
                "seed": 0,
            },
        },
        "default_root_dir": str(tmp_path / "results"),
        "trainer": {
            "max_epochs": 1,
            "logger": False,
            "callbacks": [{"class_path": "device_probe.DeviceProbe", "init_args": {"report": str(report)}}],
        },
    }
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps(config))
    environment = {
        **os.environ,
        # sitecustomize declares torchvision's operators; device_probe is the callback named above
        "PYTHONPATH": os.pathsep.join([str(SUPPORT / "site"), str(SUPPORT)]),
        "PYTHONWARNINGS": "always",
    }
    anomalib = Path(sys.executable).with_name("anomalib")
    command = [str(anomalib), "train", "--config", str(config_file)]
    command += ["--trainer.accelerator", "xpu", "--trainer.strategy", "xpu_single"]
    run = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert_ran_on_xpu(json.loads(report.read_text()))
    assert_device_log(lightning_build, output, [line for line in output.splitlines() if NOT_USED in line])
