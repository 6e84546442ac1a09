"""Run a command under a time limit, and leave nothing of it running when it ends.

`.ci/run` runs tox through this. CI stops a run at its own limit and prints little of what was going on; a run that
hangs (a test waiting on a collective whose peer died, say) would end there with no word on which. Here the command
runs in a session of its own, and

- at ``--limit`` seconds the processes of that session are listed (age, CPU time, command line: pytest's node ids
  and tox's environment folders say which test and environment hung), then terminated, and the exit status is 124;
- when the command ends, whatever it left running in its session (a rank or daemon that a test forgot) is listed and
  terminated: a process that holds the run's standard output open keeps CI waiting for the end of the output.

Processes that leave the session (daemons that call ``setsid``) are beyond its reach; the Slurm tier stops and checks
its own (tests/slurm/cluster.py).

  python ci/watchdog.py --limit SECONDS -- COMMAND [ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TIMED_OUT = 124  # as coreutils' timeout
GRACE_S = 15.0  # between SIGTERM and SIGKILL


def session_processes(sid: int) -> list[tuple[int, str]]:
    """``(pid, description)`` of every live process in session ``sid`` (Linux ``/proc``), oldest first."""
    found = []
    ticks = os.sysconf("SC_CLK_TCK")
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # ended meanwhile
        # the command name may hold spaces and parentheses: the fields after it start at the last ")"
        fields = stat[stat.rindex(")") + 2 :].split()
        state, session = fields[0], int(fields[3])
        if session != sid or state == "Z":
            continue
        cpu_s = (int(fields[11]) + int(fields[12])) / ticks
        age_s = uptime - int(fields[19]) / ticks
        found.append((age_s, int(entry.name), f"{age_s:7.0f} s old {cpu_s:7.1f} s CPU  {cmdline[:400]}"))
    return [(pid, text) for _, pid, text in sorted(found, reverse=True)]


def wait_until_gone(sid: int, seconds: float) -> list[tuple[int, str]]:
    """Wait up to ``seconds`` for session ``sid`` to have no process left; return those still there."""
    deadline = time.monotonic() + seconds
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def terminate(sid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM every process of session ``sid``, then SIGKILL what is left after ``grace_s``."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid, _ in session_processes(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        wait_until_gone(sid, wait_s)


def free_disk() -> str:
    """Free space where the run writes (the checkout and the temporary folder): a full disk stalls ranks and pip."""
    places = dict.fromkeys([os.getcwd(), os.environ.get("TMPDIR", "/tmp")])
    return ", ".join(f"{place} {shutil.disk_usage(place).free / 2**30:.1f} GiB" for place in places)


def _report(title: str, processes: list[tuple[int, str]]) -> None:
    print(f"watchdog: {title}", file=sys.stderr)
    for pid, text in processes:
        print(f"  {pid:>7} {text}", file=sys.stderr)
    print(f"watchdog: free disk: {free_disk()}", file=sys.stderr)
    sys.stderr.flush()


def run(command: list[str], limit_s: float, grace_s: float = GRACE_S) -> int:
    """Run ``command`` in a new session; its exit status, or ``TIMED_OUT`` once ``limit_s`` has passed."""
    start = time.monotonic()
    proc = subprocess.Popen(command, start_new_session=True)
    sid = proc.pid

    def stopped(signum: int, _frame: object) -> None:
        # CI's own limit, or ^C: say what was running before it goes
        _report(
            f"stopped by {signal.Signals(signum).name}; these processes were running, now terminated:",
            session_processes(sid),
        )
        terminate(sid, grace_s)
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stopped)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        _report(
            f"`{' '.join(command)}` still running after {limit_s:.0f} s, its limit; these processes were running"
            " (the oldest first), now terminated:",
            session_processes(sid),
        )
        terminate(sid, grace_s)
        proc.wait()
        return TIMED_OUT
    # a moment for processes on their way out (a rank finishing its teardown) before calling them left over
    if left := wait_until_gone(sid, grace_s):
        _report(
            f"`{' '.join(command)}` ended ({code}) after {time.monotonic() - start:.0f} s and left these processes"
            " running, now terminated (a test that does not stop what it starts):",
            left,
        )
        terminate(sid, grace_s)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=float, required=True, help="seconds the command may run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("no command given")
    return run(command, ns.limit)


if __name__ == "__main__":
    sys.exit(main())
