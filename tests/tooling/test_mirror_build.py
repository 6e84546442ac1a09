"""Mirroring into the standalone sdists, and the three patched wheels in a fresh virtual environment."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

import lightning_xpu.wheels as wheels_module
from lightning_xpu.base import Base
from lightning_xpu.mirror import mirror_packages, relative_files
from lightning_xpu.series import Series, load_series
from lightning_xpu.wheels import build

from .conftest import make_venv

# Files of the standalone sdists that upstream's mirroring does not produce: each sdist's own shell
# (setup entry, metadata, version and packaging files). Everything else must be byte-identical.
SHELL = {"__about__.py", "__setup__.py", "__version__.py", "py.typed", "version.info"}
KNOWN_EXCEPTIONS = {
    ("pytorch-lightning", "pytorch_lightning"): SHELL | {"MANIFEST.in", "README.md"},
    ("pytorch-lightning", "lightning_fabric"): SHELL,
    ("lightning-fabric", "lightning_fabric"): SHELL | {"MANIFEST.in", "README.md"},
}


def test_mirroring_the_unpatched_sdist_reproduces_the_standalone_sdists(trees: dict[str, Path], tmp_path: Path) -> None:
    mirrored = mirror_packages(trees["lightning"], tmp_path)
    for (dist, package), exceptions in KNOWN_EXCEPTIONS.items():
        shipped = trees[dist] / "src" / package
        ours, theirs = relative_files(mirrored[package]), relative_files(shipped)
        assert ours <= theirs, f"mirror creates files {sorted(ours - theirs)} that {dist} does not ship"
        assert theirs - ours == exceptions
        differing = [rel for rel in sorted(ours)
                     if (mirrored[package] / rel).read_bytes() != (shipped / rel).read_bytes()]
        assert differing == [], f"{dist}/{package}: mirrored files differ from the sdist"


def test_mirroring_leaves_the_lightning_tree_alone(trees: dict[str, Path], tmp_path: Path) -> None:
    before = sorted(relative_files(trees["lightning"] / "src"))
    mirror_packages(trees["lightning"], tmp_path)
    assert sorted(relative_files(trees["lightning"] / "src")) == before


@pytest.fixture(scope="module")
def wheels(fake_series_dir: Path, base: Base, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return build(load_series(fake_series_dir), base, tmp_path_factory.mktemp("dist"), reuse=False)


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.mark.slow
def test_an_unchanged_series_reuses_its_wheels_and_a_changed_one_is_built(
    wheels: list[Path], fake_series: Series, base: Base, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build_wheel(tree: Path, dist: Path) -> Path:
        raise AssertionError(f"built {tree.name} again")

    monkeypatch.setattr(wheels_module, "build_wheel", build_wheel)
    again = build(fake_series, base, tmp_path / "again")
    assert [w.name for w in again] == [w.name for w in wheels]
    assert [_members(w) for w in again] == [_members(w) for w in wheels]  # zip timestamps aside
    assert all(w.parent == tmp_path / "again" for w in again)
    with pytest.raises(AssertionError, match="built lightning-2.6.6-"):
        build(fake_series, base, tmp_path / "forced", reuse=False)
    first = fake_series.patches[0].path
    first.write_text(first.read_text().replace("Subject: ", "Subject: [edited] ", 1))
    with pytest.raises(AssertionError, match="built lightning-2.6.6-"):
        build(load_series(first.parent), base, tmp_path / "edited")


@pytest.mark.slow
def test_build_makes_three_patched_wheels(wheels: list[Path]) -> None:
    assert [w.name for w in wheels] == [
        "lightning-2.6.6+xpu.3-py3-none-any.whl",
        "pytorch_lightning-2.6.6+xpu.3-py3-none-any.whl",
        "lightning_fabric-2.6.6+xpu.3-py3-none-any.whl",
    ]
    lightning, pytorch_lightning, lightning_fabric = (zipfile.ZipFile(w) for w in wheels)
    assert lightning.read("lightning/version.info") == b"2.6.6+xpu.3\n"
    # The mirror rewrote the marker's import for the standalone root.
    marker = lightning_fabric.read("lightning_fabric/utilities/xpu_fake.py").decode()
    assert "from lightning_fabric.utilities.rank_zero import rank_zero_info" in marker
    assert pytorch_lightning.read("lightning_fabric/utilities/xpu_fake.py").decode() == marker
    assert b"FAKE_SERIES_PL = True" in pytorch_lightning.read("pytorch_lightning/accelerators/cuda.py")


@pytest.mark.slow
def test_wheels_install_into_fresh_venv_and_all_roots_see_the_series(wheels: list[Path], tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    *map(str, wheels)], check=True)
    probe = """
import importlib, json
import lightning.fabric, lightning.pytorch, lightning_fabric, pytorch_lightning
roots = {name: importlib.import_module(name) for name in
         ("lightning", "lightning.fabric", "lightning.pytorch", "lightning_fabric", "pytorch_lightning")}
markers = [importlib.import_module(f"{r}.utilities.xpu_fake").FAKE_SERIES
           for r in ("lightning.fabric", "lightning_fabric")]
print(json.dumps({"versions": {n: m.__version__ for n, m in roots.items()},
                  "files": {n: m.__file__ for n, m in roots.items()}, "markers": markers}))
"""
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import json

    report = json.loads(proc.stdout.splitlines()[-1])
    assert set(report["versions"].values()) == {"2.6.6+xpu.3"}
    assert all(str(tmp_path / "venv") in f for f in report["files"].values())
    assert report["markers"] == [True, True]

