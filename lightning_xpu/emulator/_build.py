"""Compile and load the emulator's native part (``csrc/emulator.cpp`` and its companions).

The library is built once per (torch build, Python version, source) into a cache directory and loaded from there
afterwards, without a compiler. Building calls the C++ compiler directly with the flags of
``torch.utils.cpp_extension`` (no ninja needed); an exclusive file lock makes concurrent builds from several
processes (pytest-xdist workers, DDP ranks) safe, and the result is moved into place atomically.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

MODULE_NAME = "lightning_xpu_emulator_C"
_CSRC = Path(__file__).parent / "csrc"
_SOURCES = tuple(_CSRC / name for name in ("emulator.cpp", "sanitizer.cpp", "xccl.cpp", "deterministic.cpp"))
_INCLUDES = (_CSRC / "deterministic_alerts.inc",)  # included by a source: part of the build key too


class EmulatorBuildError(RuntimeError):
    """The emulator's native part could not be compiled."""


def cache_dir() -> Path:
    """Where built libraries live: ``$LIGHTNING_XPU_EMULATOR_CACHE``, else ``$XDG_CACHE_HOME/lightning_xpu``."""
    explicit = os.environ.get("LIGHTNING_XPU_EMULATOR_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lightning_xpu" / "emulator"


def _build_key() -> str:
    import torch

    digest = hashlib.sha256()
    for part in (torch.__version__, str(torch.version.git_version), sys.version, sysconfig.get_platform()):
        digest.update(part.encode())
    for source in _SOURCES + _INCLUDES:
        digest.update(source.read_bytes())
    return f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:16]}"


def library_path() -> Path:
    """The path of the built library for the running torch and this source."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / _build_key() / f"{MODULE_NAME}{suffix}"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    if found is None:
        raise EmulatorBuildError(
            f"The XPU emulator needs a C++ compiler to build its native part once, and {cxx!r} was not found. "
            "Install one (for example `apt-get install g++`), or set CXX to its path, then run "
            "`python -m lightning_xpu.emulator --build`."
        )
    return found


def _compile_commands(cxx: str, workdir: Path, output: Path) -> tuple[list[list[str]], list[str]]:
    """Per-source compile commands (run in parallel) and the link command, with cpp_extension's flags."""
    from torch.utils import cpp_extension

    includes = cpp_extension.include_paths()
    python_include = sysconfig.get_path("include", scheme="posix_prefix")
    if python_include:
        includes.append(python_include)
    cflags = [
        "-O2",
        "-fPIC",
        "-std=c++20",
        "-w",
        f"-DTORCH_EXTENSION_NAME={MODULE_NAME}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(f"-isystem{path}" for path in includes),
    ]
    objects = [workdir / (source.stem + ".o") for source in _SOURCES]
    compiles = [[cxx, *cflags, "-c", str(src), "-o", str(obj)] for src, obj in zip(_SOURCES, objects, strict=True)]
    lib_dir = os.path.abspath(os.path.join(os.path.dirname(cpp_extension.__file__), os.pardir, "lib"))
    link = [cxx, "-shared", *map(str, objects), "-o", str(output), f"-L{lib_dir}"]
    link += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return compiles, link


def _run(commands: list[list[str]], cxx: str, verbose: bool) -> None:
    if verbose:
        for command in commands:
            print(" ".join(shlex.quote(c) for c in command), file=sys.stderr)
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    failures = []
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            failures.append(err[-4000:])
    if failures:
        raise EmulatorBuildError(f"Building the XPU emulator failed ({cxx}):\n" + "\n".join(failures))


def build(verbose: bool = False) -> Path:
    """Compile the native part into the cache unless it is there already; return the library's path."""
    target = library_path()
    if target.exists():
        return target
    import fcntl  # POSIX only, like the emulator itself

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        if target.exists():  # another process built it while we waited
            return target
        cxx = _compiler()
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            compiles, link = _compile_commands(cxx, Path(tmp), partial)
            _run(compiles, cxx, verbose)
            _run([link], cxx, verbose)
            os.replace(partial, target)
    return target


def load() -> ModuleType:
    """Build if needed and import the native module (registers the XPU guard, hooks, allocator and kernels)."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    import torch.distributed  # noqa: F401  (the xccl backend derives from its c10d Backend class)

    path = build()
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE_NAME] = module
    return module
