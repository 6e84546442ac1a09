"""Free a tox environment's disk space once its commands have run, where ``LIGHTNING_XPU_PRUNE_TOX_ENVS=1``.

`.ci/run` sets it: a full run builds thirteen environments, each with its own torch (about 1 GB for the CPU build,
6 to 7 GB for PyPI's CUDA builds of the torch matrix), about 27 GB if all of them stay. Pruned as each one ends, the
run needs the environments in progress only. Everything in the environment's folder goes except ``log/`` (tox writes
there until the end; the logs are what a failure is read from), so tox, missing its ``.tox-info.json``, builds the
environment afresh the next time. Never fails: a prune that cannot remove a file leaves it.

  python ci/prune_tox_env.py ENV_DIR        # tox.ini's commands_post
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SWITCH = "LIGHTNING_XPU_PRUNE_TOX_ENVS"
KEEP = frozenset({"log"})


def prune(env_dir: Path) -> int:
    """Remove everything in ``env_dir`` but ``log/``; return how many bytes were freed."""
    freed = 0
    for entry in env_dir.iterdir():
        if entry.name in KEEP:
            continue
        if entry.is_dir() and not entry.is_symlink():
            for root, _, files in os.walk(entry):
                freed += sum((Path(root) / f).lstat().st_size for f in files)
            shutil.rmtree(entry, ignore_errors=True)
        else:
            freed += entry.lstat().st_size
            entry.unlink(missing_ok=True)
    return freed


def main(argv: list[str]) -> int:
    if os.environ.get(SWITCH) != "1":
        return 0
    env_dir = Path(argv[0])
    try:
        freed = prune(env_dir)
    except OSError as err:  # a prune is an optimisation: the run's result never depends on it
        print(f"prune_tox_env: {env_dir} left as it is ({err})", file=sys.stderr)
        return 0
    print(f"prune_tox_env: removed {env_dir.name}'s environment ({freed / 2**30:.1f} GiB), kept its log/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
