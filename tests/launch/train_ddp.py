"""One rank of a multi-node job: trains a small model with ``Trainer(accelerator="xpu", strategy="ddp")`` in bf16.

Started by ``torchrun``, ``mpiexec`` or ``srun``, never by the tests directly. Each rank writes ``rank-<global>.json``
to ``--out``: the ranks the Trainer saw, its cluster environment, the process group backend, the device and dtype of
the forward pass, and the final weights, so that the tests compare what every rank ended with.

``--kill-rank R --kill-at-step S`` makes rank R write ``victim.pid`` at step S and wait there, so that the fault test
can kill it from outside in the middle of an epoch.
"""

import argparse
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, out: Path, kill_rank: int, kill_at_step: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.out, self.kill_rank, self.kill_at_step = out, kill_rank, kill_at_step
        self.forward_seen: set[tuple[str, str]] = set()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.kill_rank and self.global_step == self.kill_at_step:
            (self.out / "victim.pid").write_text(str(os.getpid()))
            time.sleep(600)  # killed here by the test
        x, y = batch
        hidden = self.net[0](x)
        self.forward_seen.add((str(hidden.device), str(hidden.dtype)))
        return nn.functional.mse_loss(self.net[2](self.net[1](hidden)).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--num-nodes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    args = parser.parse_args()

    L.seed_everything(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=generator)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    model = Regressor(args.out, args.kill_rank, args.kill_at_step)
    trainer = L.Trainer(
        accelerator="xpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        precision="bf16-mixed",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, data)

    report = {
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "cluster_environment": type(trainer.strategy.cluster_environment).__name__,
        "backend": torch.distributed.get_backend(),
        "root_device": str(trainer.strategy.root_device),
        "forward": sorted(map(list, model.forward_seen)),
        "global_step": trainer.global_step,
        "weights": [p.detach().float().cpu().flatten().tolist() for p in model.parameters()],
        "pid": os.getpid(),
    }
    (args.out / f"rank-{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
