"""Fork-based training on the two XPUs ``accelerator="auto"`` finds, as in a notebook.

``trainer``: ``Trainer(accelerator="auto", strategy="ddp_notebook", devices=2).fit(...)``; ``fabric``:
``Fabric(accelerator="auto", strategy="ddp_fork", devices=2).launch(...)``. Run by test_fork_profiles.py under a
version profile of the emulator. Prints one JSON line: ``{"outcome": "refused", ...}`` with the error when the
constructor raised, else ``{"outcome": "trained", "ranks": [...]}`` with what every forked rank reported (its device,
the process group backend and its final weights). A crash in a worker makes the launch, and so this script, fail.
"""

import argparse
import json
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _data() -> DataLoader:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)


def _report(out: Path, rank: int, device: torch.device, model: nn.Module) -> None:
    weights = [p.detach().float().sum().item() for p in model.parameters()]
    report = {"rank": rank, "device": str(device), "backend": torch.distributed.get_backend(), "weights": weights}
    (out / f"rank-{rank}.json").write_text(json.dumps(report))


class Regressor(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)
        self.out = out

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_end(self) -> None:
        _report(self.out, self.global_rank, self.device, self.net)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fabric_worker(fabric: L.Fabric, out: Path) -> None:
    model = nn.Linear(8, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    for x, y in fabric.setup_dataloaders(_data()):
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
    _report(out, fabric.global_rank, fabric.device, model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("api", choices=("trainer", "fabric"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    L.seed_everything(0)
    try:
        if args.api == "trainer":
            runner = L.Trainer(
                accelerator="auto", strategy="ddp_notebook", devices=2, max_epochs=1, logger=False,
                enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
            )
        else:
            runner = L.Fabric(accelerator="auto", strategy="ddp_fork", devices=2)
    except Exception as err:  # what the user sees at construction
        print(json.dumps({"outcome": "refused", "error": type(err).__name__, "message": str(err)}))
        return
    if args.api == "trainer":
        runner.fit(Regressor(args.out), _data())
    else:
        runner.launch(_fabric_worker, args.out)
    ranks = [json.loads(path.read_text()) for path in sorted(args.out.glob("rank-*.json"))]
    print(json.dumps({"outcome": "trained", "xpu_initialized_here": torch.xpu.is_initialized(), "ranks": ranks}))


if __name__ == "__main__":
    main()
