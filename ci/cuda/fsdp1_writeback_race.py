"""On an NVIDIA machine: does CUDA's stream sanitizer report FSDP1's gradient-writeback race?

The emulator's stream sanitizer (on by default) flags FSDP1 (``use_orig_params=True``, as
Lightning's FSDPStrategy sets it) in Lightning's ``test_strategy_sync_batchnorm``: the post-backward stream adds into
``flat_param._saved_grad_shard`` what the pre-unshard stream wrote in ``_writeback_orig_params``, and the unshard
stream waits for the pre-unshard stream only when parameters, not gradients, were written back. This runs the same
pattern on CUDA: FULL_SHARD on a fake two-rank group (one GPU, no peers needed), some gradients set and others None
before the next forward. ``TORCH_CUDA_SANITIZER=1 python ci/cuda/fsdp1_writeback_race.py`` exits 1 with CSAN's report
naming ``_writeback_tensor`` and ``_saved_grad_shard += sharded_grad`` where the race is torch's (measured on an H200,
torch 2.11.0+cu130); without the sanitizer it prints three steps. ``--nested`` wraps each Linear in an FSDP unit of its
own inside the outer one, as Lightning's ``TestFSDPModel`` does (``test_checkpoint_multi_gpus[manually_wrapped]``):
CSAN reports the same race, its trace passing ``_get_reduce_scatter_tensors`` where the emulator's sanitizer stops
(H200, torch 2.11.0+cu130, 2026-12-04).
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.testing._internal.distributed.fake_pg import FakeStore


def main() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.cuda.set_device(0)
    layers = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).cuda()
    options = {"use_orig_params": True, "sharding_strategy": ShardingStrategy.FULL_SHARD, "device_id": 0}
    if "--nested" in sys.argv[1:]:
        for i in (0, 2):
            layers[i] = FullyShardedDataParallel(layers[i], **options)
    model = FullyShardedDataParallel(layers, **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        model(torch.randn(8, 32, device="cuda")).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        first = next(iter(model.parameters()))
        first.grad = torch.zeros_like(first)  # some gradients set, others None: pre_unshard writes the flat one back
        print("step", step, "ok", flush=True)


if __name__ == "__main__":
    main()
