"""Host-device traffic and overhead per training step of Lightning's XPU path, against a raw PyTorch loop.

    LIGHTNING_XPU_EMULATOR=1 python benchmarks/bench_xpu_step.py [--steps 200] [--precision bf16-mixed]

Both loops train the same model on the same batches on ``xpu:0``, in one run. The emulator's counters count every
``torch.xpu.synchronize``, device-to-host copy and scalar read (``.item()``); the steady-state steps (after
``--warmup``) are compared. Lightning adds no host-device synchronisation per step when its counts per step equal the
raw loop's. Wall time is reported as the ratio Lightning / raw loop; on the emulator it measures Lightning's Python
overhead around CPU kernels, not Intel GPU speed. Exits non-zero when Lightning syncs or reads back more per step
than the raw loop.
"""

import argparse
import json
import os
import sys
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_xpu import emulator

_PER_STEP = ("synchronize", "d2h_copies", "item", "h2d_copies")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))


def _loader(steps: int) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * 16, 64, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)


def raw_loop(steps: int, warmup: int, precision: str) -> tuple[dict, float]:
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    model = _model().to("xpu:0")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start, before = 0.0, {}
    for i, (x, y) in enumerate(_loader(steps)):
        if i == warmup:
            before, start = emulator.counters(), time.perf_counter()
        x, y = x.to("xpu:0", non_blocking=True), y.to("xpu:0", non_blocking=True)
        with torch.autocast("xpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = nn.functional.mse_loss(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return _delta(before, emulator.counters()), time.perf_counter() - start


class _Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _Window(L.Callback):
    """Counters and time between the start of step ``warmup`` and the end of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.before, self.after, self.start, self.end = warmup, {}, {}, 0.0, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *_: object) -> None:
        if trainer.global_step == self.warmup:
            self.before, self.start = emulator.counters(), time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *_: object) -> None:
        self.after, self.end = emulator.counters(), time.perf_counter()


def lightning_loop(steps: int, warmup: int, precision: str) -> tuple[dict, float]:
    window = _Window(warmup)
    trainer = L.Trainer(
        accelerator="xpu", devices=1, precision=precision, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[window],
    )
    trainer.fit(_Module(), _loader(steps))
    return _delta(window.before, window.after), window.end - window.start


def _delta(before: dict, after: dict) -> dict:
    return {key: after[key] - before.get(key, 0) for key in _PER_STEP}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not emulator.is_enabled():
        parser.error("run under the emulated XPU: LIGHTNING_XPU_EMULATOR=1 python benchmarks/bench_xpu_step.py")
    measured = args.steps - args.warmup
    raw, raw_time = raw_loop(args.steps, args.warmup, args.precision)
    lit, lit_time = lightning_loop(args.steps, args.warmup, args.precision)
    report = {
        "lightning": L.__version__,
        "torch": torch.__version__,
        "device": torch.xpu.get_device_name(0),
        "precision": args.precision,
        "steps_measured": measured,
        "per_step_raw": {k: v / measured for k, v in raw.items()},
        "per_step_lightning": {k: v / measured for k, v in lit.items()},
        "time_ratio_lightning_over_raw": lit_time / raw_time,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['device']}, lightning {report['lightning']}, torch {report['torch']}, {args.precision}")
        print(f"{'per step':<12}{'raw loop':>10}{'Lightning':>11}")
        for key in _PER_STEP:
            print(f"{key:<12}{report['per_step_raw'][key]:>10.2f}{report['per_step_lightning'][key]:>11.2f}")
        print(f"time Lightning / raw loop: {report['time_ratio_lightning_over_raw']:.2f}x over {measured} steps")
    extra = [k for k in ("synchronize", "d2h_copies", "item") if lit[k] > raw[k]]
    if extra:
        print(f"Lightning adds per-step host-device synchronisation: {extra}", file=sys.stderr)
    return 1 if extra else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
