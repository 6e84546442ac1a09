"""A Lightning callback that records which devices a run's tensors were on, for the downstream tests to assert.

It sees what the Trainer hands every hook: the batch, the module's parameters, the training loss, the optimizer's state
after each step and what ``test_step`` returned. Given a ``report`` path it also writes what it saw there as JSON after
each stage, so a test can read it back from a CLI run in another process.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer


def tensor_devices(value: object) -> Iterator[str]:
    """The devices of the tensors in ``value``: a tensor, a mapping, a sequence or a dataclass (anomalib's batches)."""
    if isinstance(value, torch.Tensor):
        yield str(value.device)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensor_devices(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensor_devices(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from tensor_devices(getattr(value, field.name))


class DeviceProbe(Callback):
    """Records the devices of batches, parameters, losses, optimizer state and test outputs, per stage."""

    def __init__(self, report: str | None = None) -> None:
        self.report = Path(report) if report else None
        self.devices: dict[str, set[str]] = {}
        self.batches = {"train": 0, "test": 0}
        self.accelerator = ""
        self.strategy = ""
        self.root_device = ""

    def _see(self, what: str, value: object) -> None:
        self.devices.setdefault(what, set()).update(tensor_devices(value))

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.accelerator = f"{type(trainer.accelerator).__module__}.{type(trainer.accelerator).__qualname__}"
        self.strategy = f"{type(trainer.strategy).__module__}.{type(trainer.strategy).__qualname__}"
        self.root_device = str(trainer.strategy.root_device)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.batches["train"] += 1
        self._see("train batch", batch)
        self._see("train parameters", list(pl_module.parameters()))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._see("train loss", outputs)
        for optimizer in trainer.optimizers:
            for state in optimizer.state.values():
                # torch keeps Adam's (and others') step counter on the CPU unless the optimizer is `capturable`
                self._see("optimizer state", [value for key, value in state.items() if key != "step"])

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.batches["test"] += 1
        self._see("test parameters", list(pl_module.parameters()))
        self._see("test outputs", outputs)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.report is not None:
            self.report.write_text(json.dumps(self.as_dict(), indent=2) + "\n")

    def as_dict(self) -> dict[str, Any]:
        """What the probe saw, in JSON's types."""
        return {
            "accelerator": self.accelerator,
            "strategy": self.strategy,
            "root_device": self.root_device,
            "batches": self.batches,
            "devices": {what: sorted(devices) for what, devices in self.devices.items()},
        }
