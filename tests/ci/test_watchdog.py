"""ci/watchdog.py: a command past its limit is listed and stopped; what a command leaves running is too."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ci import watchdog


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_command_past_its_limit_is_listed_stopped_and_fails(capsys, tmp_path):
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    start = time.monotonic()
    code = watchdog.run([sys.executable, "-c", script], limit_s=2, grace_s=1)
    assert code == watchdog.TIMED_OUT
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert "still running after 2 s" in err
    assert "time.sleep(120)" in err  # the hung process, by its command line
    assert "free disk: " in err
    assert not _alive(int(pid_file.read_text()))


def test_what_a_command_leaves_running_is_listed_and_stopped(capsys, tmp_path):
    pid_file = tmp_path / "pid"
    # the shell ends at once; its background child (a leaked rank, say) would hold the output open
    code = watchdog.run(["sh", "-c", f"sleep 120 & echo $! > {pid_file}; exit 3"], limit_s=60, grace_s=0.5)
    assert code == 3  # the command's own status
    err = capsys.readouterr().err
    assert "ended (3)" in err
    assert "left these processes running" in err
    assert "sleep 120" in err
    assert not _alive(int(pid_file.read_text()))


def test_a_command_that_ends_cleanly_is_not_reported(capsys):
    assert watchdog.run([sys.executable, "-c", "raise SystemExit(0)"], limit_s=60, grace_s=0.5) == 0
    assert capsys.readouterr().err == ""


def test_stopping_the_watchdog_lists_and_stops_the_command(tmp_path):
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    proc = subprocess.Popen(
        [sys.executable, "ci/watchdog.py", "--limit", "600", "--", sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)  # as CI stops a run at its own limit
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in err
    assert "time.sleep(120)" in err
    assert not _alive(int(pid_file.read_text()))
