"""A throw-away Slurm cluster on this host: munged, ``slurmctld`` and one ``slurmd`` per simulated node.

Debian's Slurm (22.05 on Debian 12) is built with ``MULTIPLE_SLURMD``, so several ``slurmd`` run on one host, each
with its own node name (``slurmd -N node1``) and port. Every node offers a GPU gres of two devices with
``Flags=intel_gpu_env``: Slurm then sets ``ZE_AFFINITY_MASK`` for the tasks that ask for them, as on an Intel GPU
cluster. The "devices" are two character devices of this host that nothing opens (``task/none`` binds nothing); the
XPUs the tasks train on are the emulator's (``LIGHTNING_XPU_EMULATOR``), which honours ``ZE_AFFINITY_MASK`` as the
Level Zero runtime does.

What the probe of issue 44 found, and what this module does about it:

- ``slurmctld`` starts only where ``SlurmctldHost`` is this host's short name (``hostname -s``).
- Lightning's ``SLURMEnvironment`` takes ``MASTER_ADDR`` from ``SLURM_NODELIST`` (``node[1-2]`` -> ``node1``): the
  node names must resolve, or every rank retries its connection for minutes. ``start`` adds them to ``/etc/hosts``
  (as 127.0.0.1) and ``stop`` writes the file back byte for byte, in place (it may be a bind mount).
- Everything it starts carries ``SLURM_CI_TAG`` in its environment (``slurmstepd`` inherits it from ``slurmd``), so
  ``stop`` can prove that nothing is left running.

It needs root: the daemons run as root (``SlurmdUser=root``) and the packages are installed with apt where missing
(``install``). Used by ``conftest.py`` of this directory; by hand::

    python -m tests.slurm.cluster install        # apt-get install slurmctld slurmd slurm-client munge, if missing
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.launch.jobs import free_port, tagged_processes

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# what the tier runs: the daemons, the client commands the tests and Lightning's requeue call, and munge's checks
COMMANDS = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "squeue", "scancel", "sinfo", "munged", "munge")
HOSTS = Path("/etc/hosts")
# the simulated GPUs: any character devices of this host, which Slurm only names (task/none opens nothing)
GPU_FILES = "/dev/tty[0-1]"
GPUS_PER_NODE = 2


class SlurmError(RuntimeError):
    """Slurm could not be installed, started or stopped; the message says why and what to do."""


def missing_commands() -> list[str]:
    return [command for command in COMMANDS if shutil.which(command, path=_system_path()) is None]


def _system_path() -> str:
    # munged and the daemons are in /usr/sbin, which a non-login PATH may lack
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def install() -> float:
    """Installs Debian's Slurm and munge with apt where a command is missing; returns the seconds it took."""
    missing = missing_commands()
    if not missing:
        return 0.0
    if os.geteuid() != 0:
        raise SlurmError(
            f"Slurm is not installed (missing: {', '.join(missing)}) and installing it needs root: run this tier as"
            f" root (CI does), or install it first: apt-get install {' '.join(PACKAGES)}"
        )
    start = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SlurmError(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stderr[-3000:]}")
    if still := missing_commands():
        raise SlurmError(f"apt-get installed {', '.join(PACKAGES)} but these commands are still missing: {still}")
    return time.monotonic() - start


class Cluster:
    """``nodes`` Slurm nodes named ``node1``... on this host, state under ``root``; ``start`` then always ``stop``."""

    def __init__(self, root: Path, nodes: int = 2, cpus_per_node: int = 4) -> None:
        self.root, self.nodes, self.cpus_per_node = root, nodes, cpus_per_node
        self.tag = uuid.uuid4().hex
        self.node_names = [f"node{i}" for i in range(1, nodes + 1)]
        self.conf = root / "etc" / "slurm.conf"
        self._hosts_before: bytes | None = None
        self._our_munged = False

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client command (srun, sbatch, ...) of this cluster."""
        return dict(os.environ, SLURM_CONF=str(self.conf), PATH=_system_path())

    def start(self) -> None:
        if os.geteuid() != 0:
            raise SlurmError("the Slurm tier runs Slurm's daemons as root: run it as root (CI does)")
        for sub in ("etc", "state", "log", "run", *(f"spool/{n}" for n in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._add_hosts()
        self._start_munged()
        daemon_env = dict(self.env, SLURM_CI_TAG=self.tag)
        self._run(["slurmctld", "-f", str(self.conf)], daemon_env)
        for name in self.node_names:
            self._run(["slurmd", "-f", str(self.conf), "-N", name], daemon_env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = self._output(["sinfo", "-h", "-N", "-o", "%T"]).split()
            if states.count("idle") == self.nodes:
                return
            time.sleep(0.3)
        raise SlurmError(f"Slurm's nodes did not become idle within 30 s; logs:\n{self.logs()}")

    def stop(self) -> list[str]:
        """Cancels every job, stops every daemon this cluster started and restores ``/etc/hosts``; returns what it
        found wrong (processes still running, ``/etc/hosts`` not restored), after doing all it could."""
        problems = []
        if self.conf.exists() and shutil.which("scancel", path=_system_path()):
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=30)
            # the jobs' tasks end with their steps: wait for the queue to empty before the daemons go
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self._output(["squeue", "-h"], check=False).strip():
                time.sleep(0.3)
        # Slurm's daemons, and munged if this cluster started it
        pid_files = sorted((self.root / "run").glob("*.pid"))
        if self._our_munged:
            pid_files.append(Path("/run/munge/munged.pid"))
            self._our_munged = False
        for pid_file in pid_files:
            with contextlib.suppress(ValueError, ProcessLookupError, FileNotFoundError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while (left := tagged_processes("SLURM_CI_TAG", self.tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            problems.append(f"process {pid} ({_command(pid)}) was still running 15 s after stop; killed")
            _kill(pid)
        if self._hosts_before is not None:
            self._restore_hosts()
            if HOSTS.read_bytes() != self._hosts_before:
                problems.append("/etc/hosts could not be restored")
            self._hosts_before = None
        return problems

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}" for log in self._log_files())

    def _log_files(self) -> list[Path]:
        return sorted((self.root / "log").glob("*.log"))

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        conf = [
            "ClusterName=ci",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"SlurmctldPort={free_port()}",
            f"StateSaveLocation={self.root}/state",
            f"SlurmdSpoolDir={self.root}/spool/%n",
            f"SlurmctldPidFile={self.root}/run/slurmctld.pid",
            f"SlurmdPidFile={self.root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/log/slurmctld.log",
            f"SlurmdLogFile={self.root}/log/slurmd-%n.log",
            "MailProg=/bin/true",
            # several tasks per node on a 2-core machine: the nodes' CPUs are taken from the configuration
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=gpu",
            "ReturnToService=2",
            "InactiveLimit=0",
            # a killed task's job ends within seconds: SIGTERM, then SIGKILL after KillWait
            "KillWait=5",
            "MinJobAge=30",
        ]
        for name in self.node_names:
            conf.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()}"
                f" CPUs={self.cpus_per_node} RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            )
        conf.append(f"PartitionName=ci Nodes={','.join(self.node_names)} Default=YES MaxTime=30 State=UP")
        self.conf.write_text("\n".join(conf) + "\n")
        # Flags=intel_gpu_env: Slurm sets ZE_AFFINITY_MASK (not CUDA_VISIBLE_DEVICES) to the GPUs of each task
        (self.conf.parent / "gres.conf").write_text(
            f"NodeName={','.join(self.node_names)} Name=gpu File={GPU_FILES} Flags=intel_gpu_env\n"
        )

    def _add_hosts(self) -> None:
        self._hosts_before = HOSTS.read_bytes()
        (self.root / "hosts.before").write_bytes(self._hosts_before)
        line = f"127.0.0.1 {' '.join(self.node_names)}  # slurm-ci {self.tag}\n"
        text = self._hosts_before if self._hosts_before.endswith(b"\n") else self._hosts_before + b"\n"
        self._write_hosts(text + line.encode())

    def _restore_hosts(self) -> None:
        assert self._hosts_before is not None
        self._write_hosts(self._hosts_before)

    @staticmethod
    def _write_hosts(content: bytes) -> None:
        # in place, never by rename: /etc/hosts is often a bind mount (containers)
        with HOSTS.open("r+b") as f:
            f.write(content)
            f.truncate()

    def _start_munged(self) -> None:
        check = subprocess.run("munge -n </dev/null | unmunge", shell=True, capture_output=True, env=self.env)
        if check.returncode == 0:
            return  # a munged already answers: use it, and leave it running
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            self._run(["runuser", "-u", "munge", "--", "mungekey", "--create"], self.env)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        self._run(["runuser", "-u", "munge", "--", "munged"], dict(self.env, SLURM_CI_TAG=self.tag))
        self._our_munged = True

    def _run(self, command: list[str], env: dict[str, str]) -> None:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise SlurmError(
                f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()}\n{self.logs()}"
            )

    def _output(self, command: list[str], check: bool = True) -> str:
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise SlurmError(f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _kill(pid: int, signum: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["install"])
    parser.parse_args()
    try:
        seconds = install()
    except SlurmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"Slurm installed in {seconds:.1f} s" if seconds else "Slurm is installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
