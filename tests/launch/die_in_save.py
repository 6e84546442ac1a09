"""Trains on one emulated XPU with ``ModelCheckpoint(save_last=True)`` and stops for good in the middle of writing
``last.ckpt`` at the end of the second epoch, to be SIGKILLed there by test_checkpoint_kill.py.

Lightning's ``_atomic_save`` writes a checkpoint into a temporary file (fsspec's transaction: ``tempfile.mkstemp()``,
in ``$TMPDIR``) and moves it onto the target when complete (``shutil.move``). ``--die-in write`` stops in the write of
``last.ckpt``'s temporary file (fsspec's ``LocalFileOpener.write``), ``--die-in copy`` in the copy onto
``last.ckpt`` that the move makes where ``$TMPDIR`` is on another filesystem (``shutil.copyfile``), each after half of
the bytes. It then writes ``victim.pid`` and waits.
"""

import argparse
import os
import shutil
import time
from pathlib import Path

import fsspec.implementations.local
import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WAIT_LIMIT = 300


def _stop_here(out: Path) -> None:
    (out / "victim.pid.tmp").write_text(str(os.getpid()))
    (out / "victim.pid.tmp").replace(out / "victim.pid")
    time.sleep(WAIT_LIMIT)  # killed here by the test
    raise RuntimeError(f"not killed within {WAIT_LIMIT} s")


class DieInLastCheckpoint(Callback):
    """From the second epoch on, writing ``last.ckpt`` (``phase``: its temporary file, or the copy) stops half way."""

    def __init__(self, out: Path, phase: str) -> None:
        self.out, self.phase = out, phase

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            self._arm()

    def _arm(self) -> None:
        out = self.out
        write, copyfile = fsspec.implementations.local.LocalFileOpener.write, shutil.copyfile

        def write_half(opener: fsspec.implementations.local.LocalFileOpener, data: bytes) -> int:
            if Path(opener.path).name != "last.ckpt":
                return write(opener, data)
            write(opener, data[: len(data) // 2])
            opener.flush()
            _stop_here(out)
            return 0

        def copy_half(src: str, dst: str, **kwargs: object) -> str:
            if Path(dst).name != "last.ckpt":
                return copyfile(src, dst, **kwargs)
            data = Path(src).read_bytes()
            with open(dst, "wb") as f:
                f.write(data[: len(data) // 2])
            _stop_here(out)
            return dst

        if self.phase == "write":
            fsspec.implementations.local.LocalFileOpener.write = write_half
        else:
            shutil.copyfile = copy_half


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--die-in", choices=["write", "copy"], required=True)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    model = Regressor()
    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=args.out / "checkpoints", every_n_epochs=1, save_last=True),
        DieInLastCheckpoint(args.out, args.die_in),
    ]
    trainer = L.Trainer(
        accelerator="xpu",
        devices=1,
        max_epochs=2,
        default_root_dir=args.out,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer.fit(model, data)


if __name__ == "__main__":
    main()
