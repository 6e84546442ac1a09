"""One rank of a multi-node job on XPUs: trains a small model in bf16 with the Trainer or with Fabric, DDP or FSDP.

Started by ``torchrun``, ``mpiexec``, ``srun`` or an ``sbatch`` script, never by the tests directly. ``--runs`` names
what this process trains, one after the other in the same process group (sharing the processes keeps the tiers cheap:
each rank imports Lightning once): ``trainer-ddp``, ``trainer-fsdp``, ``fabric-ddp``, ``fabric-fsdp``. Every run
trains the same model on the same data from the same seed for ``--epochs`` epochs of 4 steps, so runs of the same
strategy end with the same weights whatever launched them, and the Trainer's weights equal Fabric's.

Each run writes ``<run>-rank-<global rank>.json`` to ``--out``: the ranks and cluster environment Lightning chose, the
process group backend, the root device, the device and dtype of the forward pass, ``ZE_AFFINITY_MASK``, the batches
trained (epoch, index) and the final weights (gathered from the shards under FSDP).

Faults (Trainer runs only):

- ``--ckpt-dir D``: ``ModelCheckpoint(dirpath=D, every_n_epochs=1, save_last=True)``; ``--sharded``: FSDP saves
  sharded checkpoints (``state_dict_type="sharded"``; else full ones); ``--resume`` fits with ``ckpt_path="last"``.
- ``--kill-rank R --kill-at-step S``: rank R writes ``victim.pid`` at step S and waits there to be killed.
- ``--requeue``: ``SLURMEnvironment(auto_requeue=True)``; in the job's first run (``SLURM_RESTART_COUNT`` unset) every
  rank writes ``epoch-end-<rank>`` at the end of epoch 0 and waits there for Slurm's ``SIGUSR1``, on which Lightning
  saves its HPC checkpoint and requeues the job. The requeued run restores that checkpoint and finishes.
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH_SIZE = 128, 8  # 4 ranks: 4 steps per epoch
LR = 0.05
# with state to checkpoint (plain SGD has none, and Lightning's FSDP cannot load an empty optimizer state from a full
# checkpoint: `list(opt_state["state"].keys())[0]`, IndexError, on every device)
MOMENTUM = 0.9
# a rank waiting to be killed or signalled gives up after this long: a test that never comes fails, never hangs
WAIT_LIMIT = 300


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.forward_seen: set[tuple[str, str]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.layers[0](x)
        self.forward_seen.add((str(hidden.device), str(hidden.dtype)))
        return self.layers[2](self.layers[1](hidden))


def data() -> DataLoader:
    x = torch.randn(SAMPLES, 16, generator=torch.Generator().manual_seed(1))
    # shuffled, as the Trainer shuffles every training set it distributes: Fabric's DistributedSampler then draws the
    # same order from the same seed (PL_GLOBAL_SEED) and epoch
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=BATCH_SIZE, shuffle=True)


def loss_fn(net: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x).float(), y)


class Regressor(L.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.net = Net()
        self.args = args
        self.batches: list[tuple[int, int]] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.args.kill_rank and self.global_step == self.args.kill_at_step:
            _write(self.args.out / "victim.pid", str(os.getpid()))
            time.sleep(WAIT_LIMIT)  # killed here by the test
            raise RuntimeError(f"rank {self.global_rank} was not killed within {WAIT_LIMIT} s")
        self.batches.append((self.current_epoch, batch_idx))
        return loss_fn(self.net, batch)

    def on_train_epoch_end(self) -> None:
        if self.args.requeue and self.current_epoch == 0 and "SLURM_RESTART_COUNT" not in os.environ:
            # every rank waits here, so that Lightning's SIGUSR1 handler saves the same end-of-epoch state on all
            # of them (its checkpoint is collective); Slurm kills these processes when the job is requeued
            _write(self.args.out / f"epoch-end-{self.global_rank}", "")
            time.sleep(WAIT_LIMIT)
            raise RuntimeError(f"rank {self.global_rank}: no SIGUSR1 within {WAIT_LIMIT} s")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def _write(path: Path, text: str) -> None:
    # whole or not at all: the test polls for these files
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _full_weights(module: nn.Module) -> list[list[float]]:
    """The model's weights on every rank, gathered from the shards where FSDP holds them."""
    fsdp = next((m for m in module.modules() if isinstance(m, FullyShardedDataParallel)), None)
    if fsdp is None:
        return [p.detach().float().cpu().flatten().tolist() for p in module.parameters()]
    with FullyShardedDataParallel.summon_full_params(fsdp, writeback=False):
        return [p.detach().float().cpu().flatten().tolist() for p in fsdp.parameters()]


def _strategy(name: str, sharded: bool) -> Any:
    if name == "fsdp" and sharded:
        return FSDPStrategy(state_dict_type="sharded")
    return name


def _what_lightning_chose(runner: L.Trainer | L.Fabric, device: torch.device, net: Net) -> dict:
    return {
        "global_rank": runner.global_rank,
        "local_rank": runner.local_rank,
        "node_rank": runner.node_rank,
        "world_size": runner.world_size,
        "cluster_environment": type(runner.strategy.cluster_environment).__name__,
        "root_device": str(device),
        "forward": sorted(map(list, net.forward_seen)),
    }


def run_trainer(args: argparse.Namespace, strategy: str) -> dict:
    L.seed_everything(0)
    model = Regressor(args)
    callbacks = []
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, every_n_epochs=1, save_last=True))
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=_strategy(strategy, sharded=args.sharded),
        precision="bf16-mixed",
        max_epochs=args.epochs,
        plugins=[SLURMEnvironment(auto_requeue=True)] if args.requeue else None,
        # a directory per run: a requeued job's Trainer restores the HPC checkpoint it finds there
        default_root_dir=args.out / f"trainer-{strategy}",
        logger=False,
        enable_checkpointing=bool(args.ckpt_dir),
        callbacks=callbacks,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, data(), ckpt_path="last" if args.resume else None)
    report = _what_lightning_chose(trainer, trainer.strategy.root_device, model.net)
    report.update(global_step=trainer.global_step, batches=model.batches, weights=_full_weights(trainer.strategy.model))
    return report


def run_fabric(args: argparse.Namespace, strategy: str) -> dict:
    fabric = L.Fabric(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        precision="bf16-mixed",
    )
    fabric.launch()
    fabric.seed_everything(0)
    net = Net()
    module = fabric.setup_module(net)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM))
    loader = fabric.setup_dataloaders(data())
    batches = []
    for epoch in range(args.epochs):
        for batch_idx, batch in enumerate(loader):
            optimizer.zero_grad()
            fabric.backward(loss_fn(module, batch))
            optimizer.step()
            batches.append((epoch, batch_idx))
    report = _what_lightning_chose(fabric, fabric.device, net)
    report.update(global_step=len(batches), batches=batches, weights=_full_weights(module))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--num-nodes", type=int, required=True)
    parser.add_argument("--accelerator", default="xpu", help="cpu: the same runs on the CPU, for comparison")
    parser.add_argument("--runs", default="trainer-ddp", help="comma-separated: trainer-ddp, fabric-fsdp, ...")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt-dir", type=Path)
    parser.add_argument("--sharded", action="store_true", help="FSDP: sharded checkpoints")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--requeue", action="store_true")
    args = parser.parse_args()

    for name in args.runs.split(","):
        api, strategy = name.split("-")
        report = run_trainer(args, strategy) if api == "trainer" else run_fabric(args, strategy)
        report.update(
            backend=torch.distributed.get_backend(),
            ze_affinity_mask=os.environ.get("ZE_AFFINITY_MASK"),
            slurm_restart_count=os.environ.get("SLURM_RESTART_COUNT"),
            pid=os.getpid(),
        )
        _write(args.out / f"{name}-rank-{report['global_rank']}.json", json.dumps(report))


if __name__ == "__main__":
    main()
