"""The command line: help for every command, clear one-line errors, doctor, build --install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, make_venv, run_cli

COMMANDS = ("workspace", "export", "port", "apply", "build", "doctor")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str) -> None:
    proc = run_cli(command, "--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"usage: lightning-xpu {command}")


def test_top_level_help_lists_commands() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert all(command in proc.stdout for command in COMMANDS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("apply",), "give a TARGET directory, --installed, or --check"),
        (("apply", "--revert"), "--revert only works together with --installed"),
        (("apply", ".", "--installed"), "give either a TARGET or --installed, not both"),
        (("apply", "/nonexistent/dir"), "/nonexistent/dir is not a directory"),
        (("apply", "--check", "--series", "/nonexistent"), "/nonexistent is not a series directory"),
        (("export", "/nonexistent/ws"), "/nonexistent/ws is not a git repository"),
    ],
)
def test_bad_input_is_one_clear_sentence(args: tuple[str, ...], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("lightning-xpu: error: ") and message in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_workspace_without_git_leaves_nothing(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    proc = run_cli("workspace", str(tmp_path / "ws"), env={"PATH": str(empty_bin)})
    assert proc.returncode == 1 and "git is required" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_doctor_reports_environment_without_touching_xpu() -> None:
    env = {"ZE_AFFINITY_MASK": "0.1", "ONEAPI_DEVICE_SELECTOR": "level_zero:0", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    proc = run_cli("doctor", env=env)
    assert proc.returncode in (0, 1, 3) and "Traceback" not in proc.stderr, proc.stderr  # the verdict's status
    for label in ("torch ", "torch.xpu ", "xccl ", "ccl (oneCCL bindings)", "lightning ", "pytorch_lightning ",
                  "lightning_fabric ", "emulator "):
        assert label in proc.stdout
    assert "ZE_AFFINITY_MASK          '0.1'" in proc.stdout
    assert "ONEAPI_DEVICE_SELECTOR    'level_zero:0'" in proc.stdout
    data = json.loads(run_cli("doctor", "--json", env=env).stdout)
    assert data["env"]["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"
    assert data["torch"]["xpu"]["device_count"] == len(data["torch"]["devices"])


def test_doctor_does_not_initialise_xpu() -> None:
    probe = ("import torch, lightning_xpu.doctor as d, lightning_xpu.verdict as v; v.diagnose(d.collect()); "
             "print(getattr(torch.xpu, 'is_initialized', lambda: False)())")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    import torch

    # Devices exist only on XPU machines (or with the emulator); there, naming them is the point of doctor.
    if torch.xpu.device_count() == 0:
        assert proc.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.slow
def test_build_install_into_fresh_venv(fake_series_dir: Path, tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(python), "-m", "lightning_xpu", "build", "--install", "--series", str(fake_series_dir),
                           "--dist", str(tmp_path / "dist")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Installed lightning, pytorch-lightning and lightning-fabric 2.6.6+xpu.3." in proc.stdout
    probe = "import lightning, pytorch_lightning, lightning_fabric as f; print(lightning.__version__, f.__file__)"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "2.6.6+xpu.3" and out[1].startswith(str(tmp_path / "venv"))
    # torch was left alone: still the parent environment's build, not a fresh download into the venv.
    assert not list((tmp_path / "venv").rglob("torch/__init__.py"))


def test_doctor_says_emulated_when_the_emulator_is_on() -> None:
    from lightning_xpu.doctor import format_report

    data = {
        "python": "3.11", "platform": "Linux", "emulator": True, "ccl_bindings": False, "shim_series_version": 2,
        "torch": {"installed": True, "version": "2.13.0+cpu", "cuda": None, "xpu_build": None, "xccl": True,
                  "xpu_default_backend": "xccl",
                  "xpu": {"compiled": True, "available": True, "device_count": 2},
                  "devices": [{"index": 0, "name": "Emulated XPU", "total_memory": 2**33},
                              {"index": 1, "error": "boom"}]},
        "lightning": [{"root": "lightning", "installed": True, "version": "2.6.6+xpu.1", "path": "/sp/lightning",
                       "series_version": 1, "patched_in_place": False},
                      {"root": "pytorch_lightning", "installed": False}],
        "env": {"ZE_AFFINITY_MASK": None},
    }
    text = format_report(data)
    assert "devices: 2 (EMULATED by lightning_xpu.emulator)" in text
    assert "xpu:0" in text and "Emulated XPU, 8.0 GiB [emulated]" in text
    assert "boom" in text
    assert "2.6.6+xpu.1 [patched wheel, series version 1; this shim's series is version 2]" in text
    assert "emulator" in text and "ON (XPU devices are emulated)" in text


def test_apply_check_with_a_relative_series_directory(fake_series_dir: Path) -> None:
    # the patches are applied from a temporary copy, so a relative --series must not be read from there
    proc = run_cli("apply", "--check", "--series", fake_series_dir.name, cwd=fake_series_dir.parent)
    assert proc.returncode == 0, proc.stderr
    assert "apply to the pinned base" in proc.stdout


def test_build_install_without_torch_names_the_xpu_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from lightning_xpu import wheels
    from lightning_xpu.errors import ToolError

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(ToolError, match=r"pip install torch --index-url https://download\.pytorch\.org/whl/xpu"):
        wheels.install([])
