"""Shared fixtures for the tooling tests.

The pinned sdists are cached in ``$LIGHTNING_XPU_CACHE`` (default ``~/.cache/lightning-xpu``) and shared by all
xdist workers; downloads are atomic, so workers racing to fill an empty cache is harmless. Every test gets its
own directories. The fake series is made per worker with the real workspace/export commands, so these tests do
not depend on the content of the project's real series.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # test this checkout's tooling, also under a bare `pytest`
    sys.path.insert(0, str(REPO))

from lightning_xpu.base import Base, base_trees, cache_dir, load_base  # noqa: E402
from lightning_xpu.series import Series, load_series  # noqa: E402
from lightning_xpu.workspace import create_workspace, export_workspace  # noqa: E402

PATCHES = REPO / "patches"
FAKE_AUTHOR = {"GIT_AUTHOR_NAME": "Fake Author", "GIT_AUTHOR_EMAIL": "fake@lightning-xpu.invalid",
               "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+0000", "GIT_COMMITTER_NAME": "Fake Author",
               "GIT_COMMITTER_EMAIL": "fake@lightning-xpu.invalid", "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+0000"}
MARKER_FILE = "src/lightning/fabric/utilities/xpu_fake.py"
MARKER_SOURCE = '''"""Marker module of the fake test series."""

from lightning.fabric.utilities.rank_zero import rank_zero_info

FAKE_SERIES = True
__all__ = ["FAKE_SERIES", "rank_zero_info"]
'''


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: builds wheels or virtual environments (seconds to tens of seconds)")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **FAKE_AUTHOR, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 and mode of every file under root (symlinks by target), to compare trees byte for byte."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = f"{oct(path.stat().st_mode)}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
        elif path.is_dir():
            out[rel + "/"] = "dir"
    return out


@pytest.fixture(scope="session")
def cache() -> Path:
    """The shared sdist cache, filled once (network on first use)."""
    path = cache_dir()
    base_trees(load_base(PATCHES), path)
    return path


@pytest.fixture(autouse=True)
def _use_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTNING_XPU_CACHE", str(cache))


@pytest.fixture(scope="session")
def base(cache: Path) -> Base:
    return load_base(PATCHES)


@pytest.fixture(scope="session")
def trees(base: Base, cache: Path) -> dict[str, Path]:
    """The pristine unpacked sdists (read-only: copy before modifying)."""
    return base_trees(base, cache)


def empty_series_dir(directory: Path) -> Path:
    directory.mkdir(parents=True)
    shutil.copy(PATCHES / "base.toml", directory / "base.toml")
    (directory / "series").write_text("# empty\n")
    return directory


@pytest.fixture(scope="session")
def fake_workspace(tmp_path_factory: pytest.TempPathFactory, base: Base, cache: Path) -> Path:
    """A workspace with three fake patches: modify+add in fabric, modify in pytorch, delete a fabric file."""
    root = tmp_path_factory.mktemp("fake")
    empty = load_series(empty_series_dir(root / "empty"))
    repo = create_workspace(empty, base, root / "ws", cache)
    cuda = repo / "src/lightning/fabric/accelerators/cuda.py"
    cuda.write_text(cuda.read_text().replace("Device should be CUDA,", "Device should be CUDA (fake series),"))
    (repo / MARKER_FILE).write_text(MARKER_SOURCE)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "fabric: add a fake marker module\n\nThe tooling tests need a change to find.\n")
    pl_cuda = repo / "src/lightning/pytorch/accelerators/cuda.py"
    pl_cuda.write_text(pl_cuda.read_text() + "\n\nFAKE_SERIES_PL = True\n")
    git(repo, "commit", "-q", "-a", "-m", "pytorch: mark the CUDA accelerator module as patched by the fake series")
    git(repo, "rm", "-q", "src/lightning/fabric/CHANGELOG.md")
    git(repo, "commit", "-q", "-m", "fabric: drop the changelog to exercise file removal")
    return repo


@pytest.fixture(scope="session")
def fake_series_dir(fake_workspace: Path, tmp_path_factory: pytest.TempPathFactory, base: Base) -> Path:
    out = tmp_path_factory.mktemp("fake-series")
    shutil.copy(PATCHES / "base.toml", out / "base.toml")
    export_workspace(fake_workspace, out, base)
    return out


@pytest.fixture
def fake_series(fake_series_dir: Path, tmp_path: Path) -> Series:
    """A private copy of the fake series (tests may corrupt it)."""
    directory = tmp_path / "series"
    shutil.copytree(fake_series_dir, directory)
    return load_series(directory)


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m lightning_xpu ARGS`` in a subprocess with the repo importable."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lightning_xpu", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or REPO)


def make_venv(path: Path) -> Path:
    """A fresh venv that also sees this environment's packages (torch) through a .pth file, after its own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_lightning_xpu_parent_env.pth").write_text("".join(f"{p}\n" for p in sorted(parent)))
    return python
