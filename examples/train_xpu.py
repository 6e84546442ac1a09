"""Train a small model on Intel GPUs with the patched Lightning: the README's main job.

    python examples/train_xpu.py [--devices N] [--precision bf16-mixed] [--strategy auto]

It runs on real Intel GPUs when torch sees them; on a machine without one, run it under the emulated XPU
(``LIGHTNING_XPU_EMULATOR=2``). It never falls back to the CPU: without an XPU, the Trainer refuses to start.
It checks, and prints, what a user would want proven: the parameters live on xpu, autocast ran on xpu in the
requested precision, and the loss went down.
"""

import argparse
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    """A two-layer MLP fitting a fixed linear target; records where and in which dtype its forward ran."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.seen: set[tuple[str, torch.dtype]] = set()
        self.param_devices: set[str] = set()
        self.losses: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        hidden = self.net[0](x)
        self.seen.add((hidden.device.type, hidden.dtype))
        self.param_devices.add(str(self.net[0].weight.device))
        loss = nn.functional.mse_loss(self.net[2](self.net[1](hidden)).float(), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        self.losses.append(float(self.trainer.callback_metrics["loss"]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=generator)
    y = x @ torch.randn(32, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    emulated = bool(os.environ.get("LIGHTNING_XPU_EMULATOR"))
    print(f"lightning {L.__version__}, torch {torch.__version__}, XPU {'emulated' if emulated else 'real'}")
    L.seed_everything(0)
    model = Regressor()
    trainer = L.Trainer(
        accelerator="xpu",
        devices=args.devices,
        strategy=args.strategy,
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, _data())
    if trainer.global_rank != 0:
        return 0

    print(f"strategy: {type(trainer.strategy).__name__}, root device: {trainer.strategy.root_device}")
    print(f"parameters during training on: {sorted(model.param_devices)}")
    print(f"forward activations seen as: {sorted(map(str, model.seen))}")
    print(f"loss per epoch: {[round(loss, 4) for loss in model.losses]}")
    if args.strategy == "ddp_spawn":
        return 0  # the spawned workers trained; the parent's copy holds the weights, not the activations
    expected = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(args.precision)
    problems = []
    if not model.seen or not all(device == "xpu" for device, _ in model.seen):
        problems.append("the forward pass did not run on xpu")
    if expected is not None and any(dtype != expected for _, dtype in model.seen):
        problems.append(f"autocast did not produce {expected} on xpu")
    if len(model.losses) > 1 and not model.losses[-1] < model.losses[0]:
        problems.append("the loss did not go down")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    print("OK" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
