"""Multi-node launches for real, on this machine: two "nodes" of two emulated XPUs each on the loopback address.

Each test starts the cluster launchers users start (``torchrun --nnodes 2`` twice with one rendezvous, Intel MPI's
``mpiexec -n 4``), each rank running ``train.py``: a ``Trainer(accelerator="xpu", precision="bf16-mixed")`` with DDP
or FSDP over ``xccl``. The ranks report what they saw and the weights they ended with; the tests check that every rank
knew its global, local and node rank, trained on its own XPU in bf16, and ended with the same weights as the others
and as the same training computed in one process on the CPU. No mpi4py is installed: under ``mpiexec``, Lightning's
``MPIEnvironment`` reads the ranks from the launcher's variables.

Faults: a rank killed (SIGKILL) in the middle of the second epoch ends the job, every launcher non-zero within
``FAULT_TIMEOUT`` and no process left; the job started again with ``ckpt_path="last"`` resumes from the checkpoint of
the first epoch and ends with the weights of the uninterrupted run, exactly: FSDP with full checkpoints under torchrun;
with sharded checkpoints under mpiexec it stops at a torch bug, which the test pins (the Slurm tier resumes DDP under
srun).

Every launch is bounded by a timeout, runs in its own session (killed as a group if it overruns), and leaves no
process behind: the tests look for any process that still carries the launch's tag in its environment.

Run by ``tox -e launch`` (which installs the patched Lightning and ``impi-rt``); by hand::

    pip install --no-deps impi-rt && lightning-xpu build --install && pytest tests/launch -p no:xdist
"""

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.launch.jobs import (
    FAULT_TIMEOUT,
    KILL_AT_STEP,
    STEPS_PER_EPOCH,
    VICTIM_RANK,
    Launch,
    check_each_on_its_xpu,
    check_trained_together,
    environment,
    expect_fsdp_sharded_resume_bug,
    max_difference,
    reference_weights,
    reports,
    train_args,
)

# DDP's weights against the one-process CPU reference (bf16 autocast, sums in another order): measured 3e-3; a
# skipped step changes them by 0.21, an unshuffled order by 0.28
DDP_TOLERANCE = 2e-2


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


@pytest.fixture
def launch(tmp_path: Path):
    job = Launch(tmp_path)
    yield job
    job.kill()


def _torchrun(env: dict[str, str], out: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{env['MASTER_PORT']}", "--rdzv-id", "launch-test",
        *train_args(out, 2, 2, *args),
    ]  # fmt: skip


def _mpiexec(
    mpiexec: str, out: Path, ranks: int, per_node: int, *args: str, wrapper: tuple[str, ...] = ()
) -> list[str]:
    hosts = "127.0.0.1,localhost" if ranks > per_node else "127.0.0.1"
    return [
        mpiexec, "-launcher", "fork", "-n", str(ranks), "-ppn", str(per_node), "-hosts", hosts,
        *wrapper, sys.executable, *train_args(out, per_node, ranks // per_node, *args),
    ]  # fmt: skip


def _start(launch: Launch, launcher: str, mpiexec: str, out: Path, *args: str) -> None:
    env = environment(launch.tag)
    if launcher == "torchrun":
        for _ in range(2):
            launch.start(_torchrun(env, out, *args), env)
    else:
        launch.start(_mpiexec(mpiexec, out, 4, 2, *args), env)


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory, mpiexec) -> Path:
    """``torchrun --nnodes 2 --nproc-per-node 2`` started twice ("two nodes") with one c10d rendezvous: DDP, then FSDP
    in the same processes."""
    out = tmp_path_factory.mktemp("torchrun")
    job = Launch(out)
    try:
        _start(job, "torchrun", mpiexec, out, "--runs", "trainer-ddp,trainer-fsdp")
        assert job.wait() == [0, 0], job.output()
        job.assert_no_orphans()
    finally:
        job.kill()
    return out


@pytest.fixture(scope="module")
def mpiexec_job(tmp_path_factory, mpiexec) -> tuple[Path, str]:
    """``mpiexec -n 4 -ppn 2`` over two "hosts", no mpi4py: ``Trainer(devices=2, num_nodes=2)`` in every rank, DDP
    then FSDP in the same processes."""
    out = tmp_path_factory.mktemp("mpiexec")
    job = Launch(out)
    try:
        _start(job, "mpiexec", mpiexec, out, "--runs", "trainer-ddp,trainer-fsdp")
        assert job.wait() == [0], job.output()
        job.assert_no_orphans()
        return out, job.output()
    finally:
        job.kill()


@pytest.fixture(scope="module")
def reference() -> list[list[float]]:
    return reference_weights()


def test_torchrun_two_nodes(torchrun_job, reference):
    for run in ("trainer-ddp", "trainer-fsdp"):
        found = reports(torchrun_job, run)
        check_trained_together(found, "TorchElasticEnvironment", per_node=2)
        check_each_on_its_xpu(found)
    assert max_difference(reports(torchrun_job, "trainer-ddp")[0]["weights"], reference) < DDP_TOLERANCE


def test_mpiexec_four_ranks_two_nodes(mpiexec_job, torchrun_job):
    out, output = mpiexec_job
    for run in ("trainer-ddp", "trainer-fsdp"):
        found = reports(out, run)
        check_trained_together(found, "MPIEnvironment", per_node=2)
        check_each_on_its_xpu(found)
    # the launcher only tells the ranks who they are: the same training ends with the same weights under both
    for run in ("trainer-ddp", "trainer-fsdp"):
        assert reports(out, run)[0]["weights"] == reports(torchrun_job, run)[0]["weights"]
    # what Lightning logs: the global rank of each process, and the local rank of each on its node
    for rank in range(4):
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/4" in output
    assert output.count("LOCAL_RANK: 0 - ZE_AFFINITY_MASK") == output.count("LOCAL_RANK: 1 - ZE_AFFINITY_MASK") == 4


def test_mpiexec_one_xpu_per_rank_is_refused(launch, tmp_path, mpiexec):
    """A site script that gives each rank a single XPU with ``ZE_AFFINITY_MASK`` leaves ``Trainer(devices=2)`` nothing
    to run on: every rank stops at construction with the devices it sees and the variable that hid the others."""
    bind = tmp_path / "bind_one_xpu_per_rank.sh"
    bind.write_text('#!/bin/sh\nexport ZE_AFFINITY_MASK="$MPI_LOCALRANKID"\nexec "$@"\n')
    bind.chmod(0o755)
    env = environment(launch.tag)
    launch.start(_mpiexec(mpiexec, tmp_path, ranks=2, per_node=2, wrapper=(str(bind),)), env)
    codes = launch.wait()
    assert codes != [0], launch.output()
    output = launch.output()
    assert "You requested xpu: [0, 1]" in output
    assert "But your machine only has: [0]" in output
    assert "`ZE_AFFINITY_MASK`" in output
    assert not list(tmp_path.glob("*-rank-*.json"))
    launch.assert_no_orphans()


@pytest.mark.parametrize(
    ("launcher", "checkpoints"),
    [("torchrun", "full"), ("mpiexec", "sharded")],
    ids=["torchrun-full", "mpiexec-sharded"],
)
def test_rank_killed_mid_epoch_then_resumed(
    launch, tmp_path, mpiexec, torchrun_job, mpiexec_job, launcher, checkpoints
):
    """Rank 2 (first rank of the second node) is killed in the middle of the second epoch: every process of the job
    exits, non-zero, within ``FAULT_TIMEOUT`` seconds, and none is left behind. Started again with
    ``ckpt_path="last"``, the FSDP job resumes from the checkpoint of the first epoch, full or sharded, and ends with
    the weights of the uninterrupted run (the Slurm tier resumes DDP under srun)."""
    run = "trainer-fsdp"
    ckpt = ("--ckpt-dir", str(tmp_path / "checkpoints"), *(("--sharded",) if checkpoints == "sharded" else ()))
    _start(launch, launcher, mpiexec, tmp_path, "--runs", run, *ckpt, "--kill-rank", str(VICTIM_RANK),
           "--kill-at-step", str(KILL_AT_STEP))  # fmt: skip
    killed_at = launch.kill_victim(tmp_path)
    codes = launch.wait(FAULT_TIMEOUT)
    elapsed = time.monotonic() - killed_at
    assert all(code != 0 for code in codes), launch.output()
    assert not list(tmp_path.glob("*-rank-*.json")), "a rank finished training without the killed one"
    launch.assert_no_orphans()
    print(f"{launcher}: all launchers exited non-zero {elapsed:.1f} s after the kill (limit {FAULT_TIMEOUT} s)")

    _start(launch, launcher, mpiexec, tmp_path, "--runs", run, *ckpt, "--resume")
    codes = launch.wait()
    launch.assert_no_orphans()
    if checkpoints == "sharded":
        expect_fsdp_sharded_resume_bug(codes, launch.output())
    assert all(code == 0 for code in codes), launch.output()
    resumed = reports(tmp_path, run)
    # the second epoch, whole, from the end of the first: what the uninterrupted run trained after its checkpoint
    assert all(r["batches"] == [[1, i] for i in range(STEPS_PER_EPOCH)] for r in resumed)
    uninterrupted = torchrun_job if launcher == "torchrun" else mpiexec_job[0]
    assert resumed[0]["weights"] == reports(uninterrupted, run)[0]["weights"]
    check_trained_together(resumed, "TorchElasticEnvironment" if launcher == "torchrun" else "MPIEnvironment", 2)
