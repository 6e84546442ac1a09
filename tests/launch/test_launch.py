"""Multi-node launches for real, on this machine: two "nodes" of two emulated XPUs each on the loopback address.

Each test starts the cluster launchers users start (``torchrun --nnodes 2`` twice with one rendezvous, Intel MPI's
``mpiexec -n 4``), each rank running ``train_ddp.py``: a ``Trainer(accelerator="xpu", strategy="ddp",
precision="bf16-mixed")`` over ``xccl``. The ranks report what they saw and the weights they ended with; the tests check
that every rank knew its global, local and node rank, trained on its own XPU in bf16, and ended with the same weights.
No mpi4py is installed: under ``mpiexec``, Lightning's ``MPIEnvironment`` reads the ranks from the launcher's variables.

Every launch is bounded by a timeout, runs in its own session (killed as a group if it overruns), and leaves no
process behind: the tests look for any process that still carries the launch's tag in its environment.

Run by ``tox -e launch`` (which installs the patched Lightning and ``impi-rt``); by hand::

    pip install --no-deps impi-rt && lightning-xpu build --install && pytest tests/launch -p no:xdist
"""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("train_ddp.py")
# a generous bound for one launch of four ranks on two cores (they take about 20 s); a hang fails the test
LAUNCH_TIMEOUT = 180
# after one rank is killed, every other process of the job must be gone within this many seconds
FAULT_TIMEOUT = 60
STEPS = 6


@pytest.fixture(scope="module", autouse=True)
def no_mpi4py() -> None:
    if importlib.util.find_spec("mpi4py") is not None:
        pytest.fail("mpi4py is installed: these tests prove that mpiexec runs work without it; uninstall it")


@pytest.fixture(scope="module")
def mpiexec() -> str:
    path = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail("mpiexec not found next to this Python: `pip install --no-deps impi-rt` (tox -e launch does)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(tag: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LIGHTNING_XPU_EMULATOR="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        LIGHTNING_XPU_LAUNCH_TAG=tag,
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
    )
    env.update(extra)
    return env


def _tagged_processes(tag: str) -> list[int]:
    """The processes whose environment carries ``tag``: every process of a launch, however it was started."""
    found = []
    needle = f"LIGHTNING_XPU_LAUNCH_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


class _Launch:
    """Launcher processes of one job, each in its own session, with their output in files."""

    def __init__(self, tmp_path: Path, tag: str) -> None:
        self.tmp_path, self.tag = tmp_path, tag
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        log = self.tmp_path / f"launcher-{len(self.procs)}.log"
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
        self.logs.append(log)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) for proc in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launch did not finish within {timeout} s (hang); output:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}" for log in self.logs)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in _tagged_processes(self.tag):
            os.kill(pid, signal.SIGKILL)

    def assert_no_orphans(self) -> None:
        # reaped launchers' children may need a moment to exit after their parent did
        deadline = time.monotonic() + 10
        while (left := _tagged_processes(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            self.kill()
            pytest.fail(f"processes left behind by the launch: {left}")


@pytest.fixture
def launch(tmp_path: Path):
    job = _Launch(tmp_path, uuid.uuid4().hex)
    yield job
    job.kill()


def _torchrun(env: dict[str, str], out: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{env['MASTER_PORT']}", "--rdzv-id", "launch-test",
        str(SCRIPT), "--out", str(out), "--devices", "2", "--num-nodes", "2", "--steps", str(STEPS), *args,
    ]  # fmt: skip


def _mpiexec(
    mpiexec: str, out: Path, ranks: int, per_node: int, *args: str, wrapper: tuple[str, ...] = ()
) -> list[str]:
    hosts = "127.0.0.1,localhost" if ranks > per_node else "127.0.0.1"
    return [
        mpiexec, "-launcher", "fork", "-n", str(ranks), "-ppn", str(per_node), "-hosts", hosts,
        *wrapper, sys.executable, str(SCRIPT), "--out", str(out),
        "--devices", str(per_node), "--num-nodes", str(ranks // per_node), "--steps", str(STEPS), *args,
    ]  # fmt: skip


def _reports(out: Path, world_size: int) -> list[dict]:
    reports = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world_size)]
    assert [r["global_rank"] for r in reports] == list(range(world_size))
    return reports


def _check_trained_together(reports: list[dict], environment: str, per_node: int) -> None:
    for rank, report in enumerate(reports):
        assert report["world_size"] == len(reports)
        assert report["local_rank"] == rank % per_node
        assert report["node_rank"] == rank // per_node
        assert report["cluster_environment"] == environment
        assert report["backend"] == "xccl"
        assert report["global_step"] == STEPS
    # all ranks end with the same weights, which DDP's gradient all-reduce guarantees over different data shards
    assert all(r["weights"] == reports[0]["weights"] for r in reports)


def _check_each_on_its_xpu(reports: list[dict]) -> None:
    """Local rank i trained on ``xpu:i``, with the forward pass in bf16."""
    for report in reports:
        device = f"xpu:{report['local_rank']}"
        assert report["root_device"] == device
        assert report["forward"] == [[device, "torch.bfloat16"]]


def test_torchrun_two_nodes(launch, tmp_path):
    """``torchrun --nnodes 2 --nproc-per-node 2`` started twice ("two nodes") with one c10d rendezvous."""
    env = _environment(launch.tag)
    for _ in range(2):
        launch.start(_torchrun(env, tmp_path), env)
    assert launch.wait(LAUNCH_TIMEOUT) == [0, 0], launch.output()
    reports = _reports(tmp_path, 4)
    _check_trained_together(reports, "TorchElasticEnvironment", per_node=2)
    _check_each_on_its_xpu(reports)
    launch.assert_no_orphans()


def test_mpiexec_four_ranks_two_nodes(launch, tmp_path, mpiexec):
    """``mpiexec -n 4 -ppn 2`` over two "hosts", no mpi4py: ``Trainer(devices=2, num_nodes=2)`` in every rank."""
    env = _environment(launch.tag)
    launch.start(_mpiexec(mpiexec, tmp_path, ranks=4, per_node=2), env)
    assert launch.wait(LAUNCH_TIMEOUT) == [0], launch.output()
    reports = _reports(tmp_path, 4)
    _check_trained_together(reports, "MPIEnvironment", per_node=2)
    _check_each_on_its_xpu(reports)
    # what Lightning logs: the global rank of each process, and the local rank of each on its node
    output = launch.output()
    for rank in range(4):
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/4" in output
    assert output.count("LOCAL_RANK: 0 - ZE_AFFINITY_MASK") == output.count("LOCAL_RANK: 1 - ZE_AFFINITY_MASK") == 2
    launch.assert_no_orphans()


def test_mpiexec_one_xpu_per_rank_is_refused(launch, tmp_path, mpiexec):
    """A site script that gives each rank a single XPU with ``ZE_AFFINITY_MASK`` leaves ``Trainer(devices=2)`` nothing
    to run on: every rank stops at construction with the devices it sees and the variable that hid the others."""
    bind = tmp_path / "bind_one_xpu_per_rank.sh"
    bind.write_text('#!/bin/sh\nexport ZE_AFFINITY_MASK="$MPI_LOCALRANKID"\nexec "$@"\n')
    bind.chmod(0o755)
    env = _environment(launch.tag)
    launch.start(_mpiexec(mpiexec, tmp_path, ranks=2, per_node=2, wrapper=(str(bind),)), env)
    codes = launch.wait(LAUNCH_TIMEOUT)
    assert codes != [0], launch.output()
    output = launch.output()
    assert "You requested xpu: [0, 1]" in output
    assert "But your machine only has: [0]" in output
    assert "`ZE_AFFINITY_MASK`" in output
    assert not list(tmp_path.glob("rank-*.json"))
    launch.assert_no_orphans()


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_rank_killed_mid_epoch(launch, tmp_path, mpiexec, launcher):
    """Rank 2 (first rank of the second node) is killed at step 3: every process of the job exits, non-zero, within
    ``FAULT_TIMEOUT`` seconds, and none is left behind."""
    env = _environment(launch.tag)
    args = ("--kill-rank", "2", "--kill-at-step", "3")
    if launcher == "torchrun":
        for _ in range(2):
            launch.start(_torchrun(env, tmp_path, *args), env)
    else:
        launch.start(_mpiexec(mpiexec, tmp_path, 4, 2, *args), env)

    victim = tmp_path / "victim.pid"
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not victim.exists():
        if time.monotonic() > deadline or any(proc.poll() is not None for proc in launch.procs):
            launch.kill()
            pytest.fail(f"rank 2 never reached step 3; output:\n{launch.output()}")
        time.sleep(0.2)
    time.sleep(0.2)  # the pid is written before the file is closed
    os.kill(int(victim.read_text()), signal.SIGKILL)
    killed_at = time.monotonic()

    codes = launch.wait(FAULT_TIMEOUT)
    elapsed = time.monotonic() - killed_at
    assert all(code != 0 for code in codes), launch.output()
    assert not list(tmp_path.glob("rank-*.json")), "a rank finished training without the killed one"
    launch.assert_no_orphans()
    print(f"{launcher}: all launchers exited non-zero {elapsed:.1f} s after the kill (limit {FAULT_TIMEOUT} s)")
