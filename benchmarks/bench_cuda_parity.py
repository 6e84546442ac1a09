"""CUDA throughput of the patched Lightning against the unpatched one, measured in one run.

    python benchmarks/bench_cuda_parity.py --unpatched PYTHON --patched PYTHON [--rounds 3] [--steps 300]

The series must leave CUDA alone. This runs the same Trainer fit (bf16-mixed MLP on ``cuda:0``) alternately under two
Python interpreters, one importing the released Lightning 2.6.6 and one the patched wheels, ``--rounds`` times each
(ABAB, so drift hits both), and reports steps per second and the ratio patched / unpatched. Each run times the steps
after ``--warmup`` between two ``torch.cuda.synchronize()`` calls at the window's edges.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def worker(steps: int, warmup: int, width: int) -> dict:
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                     nn.Linear(width, 1))

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x).float(), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Window(L.Callback):
        start = end = 0.0

        def on_train_batch_start(self, trainer: L.Trainer, *_: object) -> None:
            if trainer.global_step == warmup:
                torch.cuda.synchronize()
                self.start = time.perf_counter()

        def on_train_end(self, trainer: L.Trainer, *_: object) -> None:
            torch.cuda.synchronize()
            self.end = time.perf_counter()

    torch.manual_seed(0)
    x = torch.randn(steps * 64, width)
    window = Window()
    trainer = L.Trainer(accelerator="cuda", devices=1, precision="bf16-mixed", max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[window])
    trainer.fit(Module(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=64, pin_memory=True))
    return {"lightning": L.__version__, "steps_per_s": (steps - warmup) / (window.end - window.start)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unpatched", help="python of the environment with the released Lightning")
    parser.add_argument("--patched", help="python of the environment with the patched Lightning")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps, args.warmup, args.width)))
        return 0
    if not (args.unpatched and args.patched):
        parser.error("--unpatched and --patched are required")
    runs: dict[str, list[float]] = {"unpatched": [], "patched": []}
    versions = {}
    for _ in range(args.rounds):
        for name in ("unpatched", "patched"):
            cmd = [getattr(args, name), __file__, "--worker", f"--steps={args.steps}", f"--warmup={args.warmup}",
                   f"--width={args.width}"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            result = json.loads(out)
            versions[name] = result["lightning"]
            runs[name].append(result["steps_per_s"])
    for name, values in runs.items():
        print(f"{name:<10} lightning {versions[name]:<16} steps/s median {statistics.median(values):8.1f}  "
              f"runs {[round(v, 1) for v in values]}")
    ratio = statistics.median(runs["patched"]) / statistics.median(runs["unpatched"])
    print(f"patched / unpatched throughput: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
