"""What the launch and Slurm tiers share: starting a job's launchers, finding and killing what a job left, and
checking the ranks' reports (``train.py`` writes them) against each other and against a reference.

Every process of a job carries ``LIGHTNING_XPU_LAUNCH_TAG=<tag>`` in its environment: launchers pass their
environment to the ranks (``torchrun``, ``mpiexec`` and ``srun`` alike), so a scan of ``/proc`` finds every process
of a job, however it was started and whatever became its parent.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("train.py")
TAG_VARIABLE = "LIGHTNING_XPU_LAUNCH_TAG"
# a generous bound for one launch of four ranks on two cores busy with another tier (alone they take about 20 s)
LAUNCH_TIMEOUT = 240
# after one rank is killed, every other process of the job must be gone within this many seconds
FAULT_TIMEOUT = 60
EPOCHS, STEPS_PER_EPOCH = 2, 4  # train.py's data: 128 samples, batches of 8, four ranks
STEPS = EPOCHS * STEPS_PER_EPOCH
# the rank killed mid-epoch: the first rank of the second node, in the middle of the second epoch, after the
# checkpoint of the first epoch
VICTIM_RANK, KILL_AT_STEP = 2, STEPS_PER_EPOCH + 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tagged_processes(variable: str, value: str) -> list[int]:
    """The processes whose environment holds ``variable=value``: whatever started them, wherever they are now."""
    needle = f"{variable}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, a zombie, or not ours
            continue
    return found


def environment(tag: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LIGHTNING_XPU_EMULATOR="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    env[TAG_VARIABLE] = tag
    env.update(extra)
    return env


class Launch:
    """Launcher processes of one job, each in its own session, with their output in files."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path, self.tag = tmp_path, uuid.uuid4().hex
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        log = self.tmp_path / f"launcher-{len(self.logs)}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        self.logs.append(log)

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            codes = [proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) for proc in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launch did not finish within {timeout} s (hang); output:\n{self.output()}")
        self.procs = []
        return codes

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}" for log in self.logs)

    def wait_for(self, path: Path, timeout: float = LAUNCH_TIMEOUT) -> None:
        """Waits until a rank writes ``path``; fails if the launch ends or the time runs out first."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in self.procs):
                self.kill()
                pytest.fail(f"{path.name} never came; output:\n{self.output()}")
            time.sleep(0.2)

    def kill_victim(self, out: Path) -> float:
        """SIGKILLs the rank that wrote ``victim.pid`` (train.py's ``--kill-rank``); returns when it did."""
        self.wait_for(out / "victim.pid")
        os.kill(int((out / "victim.pid").read_text()), signal.SIGKILL)
        return time.monotonic()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in tagged_processes(TAG_VARIABLE, self.tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def assert_no_orphans(self) -> None:
        # reaped launchers' children may need a moment to exit after their parent did
        deadline = time.monotonic() + 10
        while (left := tagged_processes(TAG_VARIABLE, self.tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            self.kill()
            pytest.fail(f"processes left behind by the launch: {left}")


def train_args(out: Path, devices: int, num_nodes: int, *args: str) -> list[str]:
    return [str(SCRIPT), "--out", str(out), "--devices", str(devices), "--num-nodes", str(num_nodes), *args]


def reports(out: Path, run: str, world_size: int = 4) -> list[dict]:
    found = [json.loads((out / f"{run}-rank-{rank}.json").read_text()) for rank in range(world_size)]
    assert [r["global_rank"] for r in found] == list(range(world_size))
    return found


def check_trained_together(found: list[dict], environment: str, per_node: int, steps: int = STEPS) -> None:
    """Every rank knew its ranks and cluster environment, trained over xccl, and ended with the same weights."""
    for rank, report in enumerate(found):
        assert report["world_size"] == len(found)
        assert report["local_rank"] == rank % per_node
        assert report["node_rank"] == rank // per_node
        assert report["cluster_environment"] == environment
        assert report["backend"] == "xccl"
        assert report["global_step"] == steps
    # DDP's gradient all-reduce (FSDP's reduce-scatter) keeps every rank's weights equal over different data shards
    assert all(r["weights"] == found[0]["weights"] for r in found)


def check_each_on_its_xpu(found: list[dict]) -> None:
    """Local rank i trained on ``xpu:i``, with the forward pass in bf16."""
    for report in found:
        device = f"xpu:{report['local_rank']}"
        assert report["root_device"] == device
        assert report["forward"] == [[device, "torch.bfloat16"]]


def reference_weights() -> list[list[float]]:
    """What the four ranks compute together, computed in one process on the CPU: each step's global batch is the
    32 samples the DistributedSampler (shuffled, seed 0) gives the four ranks, the forward in bf16 autocast.

    Float sums run in another order than in the ranks' all-reduce, and FSDP keeps its parameters in bf16, so the
    ranks' weights equal these only to a tolerance (3e-3 for DDP, 2.8e-2 for FSDP), below what a fault changes: a
    skipped step 0.21, an unshuffled order 0.28, summed instead of averaged gradients diverge.
    """
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from tests.launch import train

    L.seed_everything(0, verbose=False)
    net = train.Net()
    optimizer = torch.optim.SGD(net.parameters(), lr=train.LR, momentum=train.MOMENTUM)
    dataset = train.data().dataset
    # one replica: the same permutation the four ranks draw, whole
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(dataset, batch_size=4 * train.BATCH_SIZE, sampler=sampler):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = net(x)
            torch.nn.functional.mse_loss(out.float(), y).backward()
            optimizer.step()
    return [p.detach().flatten().tolist() for p in net.parameters()]


def max_difference(weights: list[list[float]], reference: list[list[float]]) -> float:
    assert [len(w) for w in weights] == [len(r) for r in reference]
    return max(abs(a - b) for w, r in zip(weights, reference, strict=True) for a, b in zip(w, r, strict=True))


# torch's ShardedTensor.device (torch/distributed/_shard/sharded_tensor/_ops/tensor_ops.py) answers for a rank
# without a local shard with `torch.cuda.current_device()` unless the group is gloo: loading an FSDP sharded
# checkpoint (FSDP1's SHARDED_STATE_DICT holds ShardedTensors) then fails on every accelerator but CUDA wherever a
# rank holds no piece of some parameter, as here (four ranks, a 577-element flat parameter: the last layers lie in
# rank 3's shard). pytorch/pytorch#186938, open; the series' fix is described in issue 44's report.
FSDP_SHARDED_RESUME_BUG = "pytorch/pytorch#186938: ShardedTensor.device is CUDA's on a rank without a local shard"


def expect_fsdp_sharded_resume_bug(codes: list[int], output: str) -> None:
    """The resumed FSDP job failed, and only because of torch's ShardedTensor bug: then the test is an expected
    failure; any other outcome (a success included, once the series works around it) fails the test."""
    assert any(code != 0 for code in codes), "the FSDP resume succeeded: check its weights and drop this expectation"
    assert "tensor_device" in output and "Torch not compiled with CUDA enabled" in output, output
    pytest.xfail(FSDP_SHARDED_RESUME_BUG)
