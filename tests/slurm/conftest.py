"""The cluster of the Slurm tier: installed where missing, started once for the session, always stopped.

The fixture's teardown stops every job and daemon, restores ``/etc/hosts`` and then fails the session (an error at
teardown) if anything it started was still running or ``/etc/hosts`` differs from what it was: a failing test never
leaves Slurm behind.
"""

import os
import time
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import Cluster, SlurmError, install


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    try:
        seconds = install()
    except SlurmError as e:
        pytest.fail(str(e))
    if seconds:
        print(f"installed Slurm and munge with apt in {seconds:.1f} s")
    slurm = Cluster(tmp_path_factory.mktemp("slurm"))
    start = time.monotonic()
    try:
        slurm.start()
        print(f"Slurm up in {time.monotonic() - start:.1f} s: {', '.join(slurm.node_names)} (SLURM_CONF={slurm.conf})")
        yield slurm
    except SlurmError as e:
        pytest.fail(str(e))
    finally:
        problems = slurm.stop()
    if problems:
        pytest.fail("Slurm did not stop cleanly:\n" + "\n".join(problems))


@pytest.fixture(scope="session", autouse=True)
def root_only() -> None:
    if os.geteuid() != 0:
        pytest.fail("the Slurm tier starts Slurm's daemons and edits /etc/hosts: run it as root (CI does)")
