"""The pinned base (download, hash check, cache) and the series reader."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from lightning_xpu.base import LIGHTNING, Base, fetch_sdist, load_base, unpacked_sdist
from lightning_xpu.errors import ToolError
from lightning_xpu.series import Series, find_series_dir, load_series, parse_patch, read_series_names

from .conftest import PATCHES, run_cli

OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1"}


def test_base_record_pins_three_sdists() -> None:
    base = load_base(PATCHES)
    assert base.version == "2.6.6"
    assert {sd.name for sd in base.sdists} == {"lightning", "pytorch-lightning", "lightning-fabric"}
    assert base.sdist(LIGHTNING).sha256 == "1c6329e241f8a85f29fedead89c1ee138b36caa08de60c260c6a7eaee81c8295"


def test_real_series_is_readable() -> None:
    series = load_series(find_series_dir())
    assert series.directory == PATCHES
    assert series.version == len(series.patches)


def test_cached_tarball_with_wrong_hash_is_refused(base: Base, cache: Path, tmp_path: Path) -> None:
    sd = base.sdist(LIGHTNING)
    (tmp_path / "sdists").mkdir()
    corrupt = tmp_path / "sdists" / sd.filename
    corrupt.write_bytes((cache / "sdists" / sd.filename).read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ToolError, match="has sha256 .* but the base record expects"):
        unpacked_sdist(sd, base.version, tmp_path)
    assert not (tmp_path / "unpacked").exists()


def test_download_with_wrong_hash_is_refused_and_leaves_cache_empty(
    base: Base, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Serve the real tarball from a local directory, but pin a different hash.
    links = tmp_path / "links"
    links.mkdir()
    sd = base.sdist("lightning-fabric")
    shutil.copy(cache / "sdists" / sd.filename, links)
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    wrong = dataclasses.replace(sd, sha256="0" * 64)
    empty_cache = tmp_path / "cache"
    with pytest.raises(ToolError, match="downloaded lightning_fabric-2.6.6.tar.gz has sha256 c22b4b51.* refusing"):
        fetch_sdist(wrong, base.version, empty_cache)
    assert list((empty_cache / "sdists").iterdir()) == []
    # The same local download with the right hash lands in the cache.
    assert fetch_sdist(sd, base.version, empty_cache).is_file()


def test_missing_network_gives_one_clear_error(tmp_path: Path) -> None:
    proc = run_cli("apply", "--check", env={**OFFLINE, "LIGHTNING_XPU_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 1
    assert proc.stderr.startswith("lightning-xpu: error: could not download lightning==2.6.6 from the package index")
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "cache" / "sdists").iterdir())


def test_series_parses_subjects_files_and_hunks(fake_series: Series) -> None:
    assert fake_series.version == 3
    assert fake_series.local_version == "xpu.3"
    first = fake_series.patches[0]
    assert first.name == "0001-fabric-add-a-fake-marker-module.patch"
    assert first.subject == "fabric: add a fake marker module"
    assert first.files == ("src/lightning/fabric/accelerators/cuda.py", "src/lightning/fabric/utilities/xpu_fake.py")
    assert [h.index for h in first.hunks if h.path.endswith("cuda.py")] == [1]
    assert fake_series.patches[1].subject.startswith("pytorch: mark the CUDA accelerator module")
    assert "src/lightning/fabric/CHANGELOG.md" in fake_series.files


def test_series_file_accepts_quilt_comments_and_p1(fake_series: Series) -> None:
    directory = fake_series.directory
    names = [p.name for p in fake_series.patches]
    (directory / "series").write_text(f"# comment\n\n{names[0]} -p1\n{names[1]}  # trailing\n{names[2]}\n")
    assert read_series_names(directory) == names


@pytest.mark.parametrize(
    ("content", "match"),
    [("0001-x.patch -p0\n", "only the -p1 option"), ("a.patch\na.patch\n", "repeated"),
     ("missing.patch\n", "does not exist")],
)
def test_bad_series_file_is_rejected(fake_series: Series, content: str, match: str) -> None:
    (fake_series.directory / "series").write_text(content)
    with pytest.raises(ToolError, match=match):
        load_series(fake_series.directory)


def test_corrupt_patch_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "0001-bad.patch"
    bad.write_text("From 0000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] bad\n\nno diff here\n")
    with pytest.raises(ToolError, match="contains no `diff --git` section"):
        parse_patch(bad)


def test_series_digest_changes_with_content(fake_series: Series) -> None:
    before = fake_series.digest
    patch = fake_series.patches[1].path
    patch.write_text(patch.read_text().replace("FAKE_SERIES_PL", "FAKE_SERIES_PX"))
    assert load_series(fake_series.directory).digest != before
