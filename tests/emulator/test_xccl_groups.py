"""Process groups over the emulated xccl as ProcessGroupXCCL has them in each release: binding, splitting, barriers.

What torch-xpu-ops' ProcessGroupXCCL does, release/2.8 to release/2.14 (src/xccl/ProcessGroupXCCL.{hpp,cpp}): it never
overrides ``supportsSplitting()``, so torch neither connects a bound group eagerly nor splits it; a barrier runs on
``device_ids[0]``, else the bound device, else the first device a collective used, else a guess from the rank
(``rank % device count``: the group rank up to 2.9, the global rank from 2.10; a LOG(WARNING) line from 2.9), and a
group neither bound nor used yet builds its communicator on that device, whatever device the process set.
"""

from __future__ import annotations

import json

import pytest

# Runs `worker(rank, port, queue, log)` on `nprocs` spawned ranks (stderr, where C++ logs, into the file `log`) and
# prints what each put in the queue, by rank.
_RANKS_MAIN = """
def run(rank, port, queue, log):
    os.dup2(os.open(log % rank, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)  # C++ LOG(WARNING) writes to fd 2
    torch.xpu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = worker(rank)
    dist.destroy_process_group()
    r["python_warnings"] = [str(w.message).split(".")[0] for w in caught if "barrier" in str(w.message)]
    guessed = re.compile(r"using GPU (\\d+) as device used by this process is currently unknown")
    r["log"] = [int(m.group(1)) for m in map(guessed.search, open(log % rank)) if m]   # the devices it guessed
    queue.put((rank, r))

if __name__ == "__main__":
    nprocs = int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(port, queue, os.path.join(tempfile.mkdtemp(), "stderr%d")), nprocs=nprocs)
    print(json.dumps([r for _, r in sorted(queue.get() for _ in range(nprocs))]))
"""

_HEADER = """
import json, os, re, socket, sys, tempfile, warnings, torch, torch.distributed as dist
import torch.multiprocessing as mp
"""


def _run_ranks(run_emulated, tmp_path, body: str, nprocs: int, env: dict[str, str] | None = None) -> list[dict]:
    script = tmp_path / "ranks.py"
    script.write_text(_HEADER + body + _RANKS_MAIN)
    out = run_emulated(
        f"import runpy, sys; sys.argv = ['x', '{nprocs}']; runpy.run_path({str(script)!r}, run_name='__main__')",
        devices=nprocs,
        env=env,
        timeout=300,
    )
    return json.loads(out.strip().splitlines()[-1])


_UNBOUND_BARRIERS = """
def worker(rank):
    dist.init_process_group("xccl", rank=rank, world_size=4)    # unbound, as Lightning leaves XPU groups
    sub = dist.new_group([2, 3])
    r = {}
    if rank in (2, 3):                                           # a group of its own, unused: a guess from the rank
        dist.barrier(group=sub, device_ids=None)                 # runs there, whatever device this process set
    dist.barrier()                                               # the world: rank % 4 is the rank's own device
    dist.barrier(device_ids=[rank])                              # named: no guess, no warning
    return r
"""


@pytest.mark.parametrize("release", ["2.8", "2.9", "2.13"])
def test_barrier_on_an_unbound_unused_group_guesses_the_device_as_the_release(run_emulated, tmp_path, release):
    ranks = _run_ranks(run_emulated, tmp_path, _UNBOUND_BARRIERS, 4, env={"LIGHTNING_XPU_EMULATOR_TORCH": release})
    for rank, r in enumerate(ranks):
        # the running torch's own (Python) warning of an unbound barrier, on the group's rank 0 (rank 2 is the
        # sub-group's); the profile models ProcessGroupXCCL, not torch's Python code
        warned = rank in (0, 2)
        assert r["python_warnings"] == (["barrier(): using the device under current context"] if warned else [])
        if release == "2.8":
            assert r["log"] == []  # 2.8 guesses silently
            continue
        # the sub-group's barrier guesses from the group rank (0, 1) on 2.9, the global rank from 2.10; the world's
        assert r["log"] == ([rank - 2 if release == "2.9" else rank] if rank in (2, 3) else []) + [rank]
    # up to 2.9 ranks 2 and 3 run the sub-group's barrier on xpu:0 and xpu:1 (ranks 0's and 1's devices, the log
    # says so), from 2.10 on their own: ProcessGroupXCCL builds the group's communicator on the guessed device


_BOUND_GROUP = """
def worker(rank):
    from torch.distributed.device_mesh import init_device_mesh
    dist.init_process_group("xccl", rank=rank, world_size=4, device_id=torch.device("xpu", rank))
    r = {"supports_splitting": dist.group.WORLD._get_backend(torch.device("xpu", rank)).supports_splitting}
    for name, call in (
        ("split_group", lambda: dist.split_group(split_ranks=[[0, 1], [2, 3]])),
        ("device_mesh_2d", lambda: init_device_mesh("xpu", (2, 2), mesh_dim_names=("dp", "tp"))),
        ("gloo_group", lambda: dist.new_group(backend="gloo")),
    ):
        try:
            call()
            r[name] = "created"
        except RuntimeError as e:
            r[name] = str(e).splitlines()[0]
    pair = dist.new_group([0, 1])                      # not split: a communicator of its own
    if rank < 2:
        t = torch.full((2,), float(rank + 1), device="xpu")
        dist.all_reduce(t, group=pair)
        r["new_group"] = t.tolist()
    dist.barrier()                                     # on the bound device: no guess, no warning
    return r
"""


def test_a_bound_group_is_never_split(run_emulated, tmp_path):
    """torch 2.12+ (the running torch is 2.13) splits a bound group for a device mesh, and XCCL can't split; a gloo
    group can't be made beside a group bound to an XPU (gloo has no XPU backend: pytorch/pytorch#162237)."""
    ranks = _run_ranks(run_emulated, tmp_path, _BOUND_GROUP, 4)
    cannot_split = "No backend for the parent process group or its backend does not support splitting"
    for rank, r in enumerate(ranks):
        assert r["supports_splitting"] is False
        assert r["split_group"] == cannot_split
        assert r["device_mesh_2d"] == cannot_split
        assert r["gloo_group"] == "No backend type associated with device type xpu"
        assert r.get("new_group") == ([3.0, 3.0] if rank < 2 else None)
        assert r["python_warnings"] == []
        assert r["log"] == []
