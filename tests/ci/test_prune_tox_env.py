"""`.ci/run` frees each tox environment's venv when it ends, keeping its logs; plain tox runs keep their venvs."""

import subprocess
import sys
from pathlib import Path

PRUNE = Path(__file__).resolve().parents[2] / "ci" / "prune_tox_env.py"


def _fake_env(root: Path) -> Path:
    env = root / "series-mocked"
    (env / "lib" / "python3.11" / "site-packages" / "torch").mkdir(parents=True)
    (env / "lib" / "python3.11" / "site-packages" / "torch" / "libtorch_cpu.so").write_bytes(b"\0" * 4096)
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "log").mkdir()
    (env / "log" / "4-commands[0].log").write_text("509 passed\n")
    (env / ".tox-info.json").write_text("{}")
    return env


def _prune(env: Path, switch: str | None) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin"}
    if switch is not None:
        environ["LIGHTNING_XPU_PRUNE_TOX_ENVS"] = switch
    return subprocess.run([sys.executable, str(PRUNE), str(env)], env=environ, capture_output=True, text=True)


def test_the_switch_removes_the_venv_and_keeps_the_logs(tmp_path):
    env = _fake_env(tmp_path)
    result = _prune(env, "1")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in env.iterdir()) == ["log"]
    assert (env / "log" / "4-commands[0].log").read_text() == "509 passed\n"
    # without .tox-info.json tox builds the environment afresh next time instead of reusing an emptied one
    assert not (env / ".tox-info.json").exists()
    assert "removed series-mocked's environment" in result.stdout


def test_without_the_switch_nothing_is_removed(tmp_path):
    env = _fake_env(tmp_path)
    for switch in (None, "0"):
        assert _prune(env, switch).returncode == 0
        assert sorted(p.name for p in env.iterdir()) == [".tox-info.json", "bin", "lib", "log"]


def test_a_prune_that_fails_does_not_fail_the_environment(tmp_path):
    result = _prune(tmp_path / "no-such-env", "1")
    assert result.returncode == 0
    assert "left as it is" in result.stderr
