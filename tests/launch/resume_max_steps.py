"""Lightning's resume of a ``max_steps`` run from its end-of-epoch checkpoint, on the CPU and on an emulated XPU.

For each device, in this one process: a run trained without interruption, a run stopped in the middle of its second
epoch (an exception in ``training_step``: on disk, what a killed job leaves, ``last.ckpt`` from the end of the first
epoch), and that run started again with ``ckpt_path="last"``. Prints one JSON line: per device, the batches
(epoch, index) each run trained and its final weights. Run by test_resume.py with ``LIGHTNING_XPU_EMULATOR=1``.
"""

import json
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS_PER_EPOCH, MAX_STEPS, STOP_AT_STEP = 4, 8, 6


class Stopped(Exception):
    """Stands for the kill: the run ends with what it saved before."""


class Regressor(L.LightningModule):
    def __init__(self, stop_at_step: int = -1) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.stop_at_step = stop_at_step
        self.batches: list[tuple[int, int]] = []
        self.devices_seen: set[str] = set()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.stop_at_step:
            raise Stopped
        self.batches.append((self.current_epoch, batch_idx))
        x, y = batch
        self.devices_seen.add(str(x.device))
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(accelerator: str, root: Path, stop_at_step: int = -1, resume: bool = False) -> Regressor:
    L.seed_everything(0, verbose=False)
    x = torch.randn(STEPS_PER_EPOCH * 8, 4, generator=torch.Generator().manual_seed(1))
    model = Regressor(stop_at_step)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        precision="32-true",
        max_steps=MAX_STEPS,
        default_root_dir=root,
        callbacks=[ModelCheckpoint(dirpath=root, every_n_epochs=1, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
        trainer.fit(model, data, ckpt_path="last" if resume else None)
    except Stopped:
        pass
    return model


def main() -> None:
    results = {}
    for accelerator in ("cpu", "xpu"):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            uninterrupted = fit(accelerator, Path(a))
            fit(accelerator, Path(b), stop_at_step=STOP_AT_STEP)
            resumed = fit(accelerator, Path(b), resume=True)
        results[accelerator] = {
            name: {
                "batches": m.batches,
                "devices": sorted(m.devices_seen),
                "weights": [p.detach().cpu().flatten().tolist() for p in m.parameters()],
            }
            for name, m in (("uninterrupted", uninterrupted), ("resumed", resumed))
        }
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
