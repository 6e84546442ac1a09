"""The pinned upstream base: the three Lightning sdists, downloaded once, verified by sha256 and unpacked."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.errors import ToolError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BASE_FILE = "base.toml"
LIGHTNING = "lightning"
PYTORCH_LIGHTNING = "pytorch-lightning"
LIGHTNING_FABRIC = "lightning-fabric"


@dataclass(frozen=True)
class Sdist:
    """One pinned source distribution."""

    name: str
    filename: str
    sha256: str

    @property
    def dirname(self) -> str:
        """The top-level directory inside the tarball, e.g. ``lightning-2.6.6``."""
        return self.filename[: -len(".tar.gz")]


@dataclass(frozen=True)
class Base:
    """The pinned base: an upstream version and its three sdists."""

    version: str
    sdists: tuple[Sdist, ...]

    def sdist(self, name: str) -> Sdist:
        for sd in self.sdists:
            if sd.name == name:
                return sd
        raise ToolError(f"the base record has no sdist named {name!r}")


def load_base(series_dir: Path) -> Base:
    """Read ``base.toml`` from the series directory."""
    path = series_dir / BASE_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if "upstream" in data and "sdist" not in data:
            raise ToolError(f"the series next to {path} is made against an upstream git commit, not the released "
                            "sdists; it applies to an upstream checkout (--upstream CHECKOUT)")
        sdists = tuple(Sdist(d["name"], d["filename"], d["sha256"].lower()) for d in data["sdist"])
        base = Base(str(data["version"]), sdists)
    except FileNotFoundError:
        raise ToolError(f"the base record {path} is missing") from None
    except (KeyError, TypeError, tomllib.TOMLDecodeError) as err:
        raise ToolError(f"the base record {path} is malformed ({err})") from None
    for name in (LIGHTNING, PYTORCH_LIGHTNING, LIGHTNING_FABRIC):
        base.sdist(name)
    return base


def cache_dir() -> Path:
    """``$LIGHTNING_XPU_CACHE``, default ``~/.cache/lightning-xpu``."""
    env = os.environ.get("LIGHTNING_XPU_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lightning-xpu"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(sd: Sdist, version: str, cache: Path | None = None) -> Path:
    """Return the verified tarball of ``sd`` in the cache, downloading it with pip first if needed.

    The download lands in a temporary directory and is moved into the cache only after its sha256 matched,
    so a failed or wrong download leaves the cache as it was.
    """
    cache = cache or cache_dir()
    target = cache / "sdists" / sd.filename
    if target.is_file():
        actual = sha256_of(target)
        if actual != sd.sha256:
            raise ToolError(
                f"cached {target} has sha256 {actual} but the base record expects {sd.sha256}; "
                "delete the file and retry"
            )
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--retries", "1",
               "--disable-pip-version-check", "-d", tmp, f"{sd.name}=={version}"]
        if _has_setuptools():
            cmd.insert(cmd.index("-d"), "--no-build-isolation")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        downloaded = Path(tmp) / sd.filename
        if proc.returncode != 0 or not downloaded.is_file():
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.startswith("ERROR")]
            reason = lines[0].removeprefix("ERROR: ") if lines else "pip produced no file"
            raise ToolError(
                f"could not download {sd.name}=={version} from the package index ({reason}); "
                f"check the network or put {sd.filename} into {target.parent}"
            )
        actual = sha256_of(downloaded)
        if actual != sd.sha256:
            raise ToolError(
                f"downloaded {sd.filename} has sha256 {actual} but the base record expects {sd.sha256}; refusing it"
            )
        os.replace(downloaded, target)
    return target


def _has_setuptools() -> bool:
    import importlib.util

    return importlib.util.find_spec("setuptools") is not None


def unpacked_sdist(sd: Sdist, version: str, cache: Path | None = None) -> Path:
    """Return the unpacked, read-only-by-convention tree of ``sd`` (its ``NAME-VERSION`` directory).

    Callers that modify a tree must copy it first.
    """
    cache = cache or cache_dir()
    tarball = fetch_sdist(sd, version, cache)
    root = cache / "unpacked" / f"{sd.dirname}-{sd.sha256[:16]}"
    if root.is_dir():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".unpack-"))
    try:
        with tarfile.open(tarball) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except TypeError:  # pragma: no cover - Python without extraction filters
                tar.extractall(tmp)
        inner = tmp / sd.dirname
        if not inner.is_dir():
            raise ToolError(f"{tarball} does not contain the directory {sd.dirname}/")
        try:
            os.rename(inner, root)
        except OSError:
            if not root.is_dir():  # another process won the race otherwise
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def base_trees(base: Base, cache: Path | None = None) -> dict[str, Path]:
    """Unpacked trees of all three sdists, keyed by distribution name."""
    return {sd.name: unpacked_sdist(sd, base.version, cache) for sd in base.sdists}
