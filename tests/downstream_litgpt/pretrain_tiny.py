"""LitGPT's ``pretrain`` as its users call it (``litgpt.pretrain.setup``, LitGPT's default ``torch.compile`` and
precision), with a tiny GPT from random weights on random tokens: nothing is downloaded, no tokenizer is needed.

    python pretrain_tiny.py tiny --out_dir OUT_DIR --devices N

The arguments are those of ``litgpt pretrain`` (``litgpt.pretrain.setup``): LitGPT parses the command line again when
it saves the final checkpoint's ``hyperparameters.yaml``. Fabric's launcher starts this script again for ranks 1..N-1.
Each rank prints one JSON line (``rank-result``): the peak memory the XPU allocator handed out, and inductor's
counters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from litgpt import Config
from litgpt.args import EvalArgs, TrainArgs
from litgpt.data import DataModule
from litgpt.pretrain import setup
from torch.utils.data import DataLoader

VOCAB = 128
SEQ = 32


class RandomTokens(DataModule):
    """Random token ids, ``SEQ + 1`` per sample as LitGPT's pretraining data modules give them."""

    def connect(self, tokenizer=None, batch_size: int = 1, max_seq_length: int | None = None, **kwargs) -> None:
        self.batch_size = batch_size

    def _loader(self, seed: int) -> DataLoader:
        data = torch.randint(0, VOCAB, (64, SEQ + 1), generator=torch.Generator().manual_seed(seed))
        return DataLoader(data, batch_size=self.batch_size, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        return self._loader(0)

    def val_dataloader(self) -> DataLoader:
        return self._loader(1)


def main(out_dir: Path, devices: int) -> None:
    config = Config(
        name="tiny", block_size=SEQ, vocab_size=VOCAB, padded_vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32
    )
    setup(
        model_name="tiny",
        model_config=config,
        out_dir=out_dir,
        data=RandomTokens(),
        train=TrainArgs(
            save_interval=None,
            log_interval=1,
            global_batch_size=2 * devices,
            micro_batch_size=2,
            max_tokens=4 * 2 * SEQ * devices,  # four steps
            lr_warmup_steps=1,
            max_seq_length=SEQ,
            min_lr=1e-4,
            max_norm=1.0,
            tie_embeddings=False,
        ),
        eval=EvalArgs(interval=1000, max_iters=1, final_validation=False),
        devices=devices,
        logger_name="csv",
    )
    from torch._dynamo.utils import counters

    result = {
        "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        "max_memory_allocated": torch.xpu.max_memory_allocated(),
        "inductor": dict(counters["inductor"]),
        "graphs": counters["stats"]["unique_graphs"],
    }
    print("rank-result", json.dumps(result), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model_name", choices=["tiny"])
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--devices", type=int, required=True)
    args = parser.parse_args()
    main(args.out_dir, args.devices)
