"""Compile and load the emulator's native part (``csrc/*.cpp``, declarations shared in ``csrc/emulator.h``).

One source is generated per torch: ``device_checks.cpp`` lists the operators whose device check torchgen leaves to
their kernel (``device_check: NoCheck`` in the running torch's ``native_functions.yaml``); every other operator's
XPU kernel refuses a CPU tensor, even a 0-dim one, beside XPU tensors, as CUDA's does.

The library is built once per (torch build, Python version, source) into a cache directory and loaded from there
afterwards, without a compiler. Building calls the C++ compiler directly with the flags of
``torch.utils.cpp_extension`` (no ninja needed); an exclusive file lock makes concurrent builds from several
processes (pytest-xdist workers, DDP ranks) safe, and the result is moved into place atomically.

The sources are compiled as two translation units that ``#include`` them (``_UNITS``): most of a source's compile
time is parsing torch's headers, so two units parse them twice instead of once per source (a cold build on two cores:
116 s wall and 199 s of CPU with a unit per source, 35 s and 60 s as two; docs/testing.md). A build prints what it
does to stderr, a line at least every ``PROGRESS_INTERVAL_S`` seconds, since it runs inside whatever first needs the
emulator (``import torch`` under ``LIGHTNING_XPU_EMULATOR``, ``lightning-xpu doctor``); a process that waits for
another one's build says so once.
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
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import ModuleType
from typing import IO

MODULE_NAME = "lightning_xpu_emulator_C"
_CSRC = Path(__file__).parent / "csrc"
# included by a source: part of the build key too
_INCLUDES = (_CSRC / "emulator.h", _CSRC / "deterministic_alerts.inc", _CSRC / "xpu_ops.inc")
# The translation units: each compiles its sources, in this order, as one file that #includes them, so names at file
# scope (static functions, anonymous namespaces) must be unique within a unit. Split so that the two take about the
# same time (measured: xccl.cpp's collectives and bindings.cpp's pybind11 code are the two largest parts), one per core
# on a 2-core machine; the split is fixed, so every machine compiles the same units.
_UNITS = (
    ("runtime", ("topology.cpp", "queues.cpp", "device_guard.cpp", "allocator.cpp", "generator.cpp", "hooks.cpp",
                 "sanitizer.cpp", "xccl.cpp", "reducer_timer.cpp", "deterministic.cpp", "xpu_ops.cpp")),
    ("operators", ("kernels.cpp", "sdpa.cpp", "batch_norm.cpp", "fallback.cpp", "bindings.cpp")),
)
_SOURCES = tuple(_CSRC / name for _, names in _UNITS for name in names)
# A line at least this often while compiling: a silent minute reads as a hang.
PROGRESS_INTERVAL_S = 10.0
# What a cold build takes on two idle cores (35 s measured by benchmarks/bench_emulator_build.py, docs/testing.md),
# said before it starts; a busy or one-core machine takes longer, which the message says too.
_EXPECTED_WALL_S = 40


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
    for source in (*_SOURCES, *_INCLUDES, Path(__file__)):  # this file generates device_checks.cpp
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


def _native_functions_yaml() -> Path:
    spec = importlib.util.find_spec("torchgen")
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent
    yaml = None if path is None else path / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if yaml is None or not yaml.is_file():
        raise EmulatorBuildError(
            "The XPU emulator reads which operators check their tensors' devices from torch's "
            "torchgen/packaged/ATen/native/native_functions.yaml, which this torch installation lacks. "
            "Reinstall torch from its wheel (`pip install --force-reinstall torch==<version>`)."
        )
    return yaml


def no_device_check_ops(yaml_text: str) -> list[str]:
    """The ``name.overload`` of every operator that native_functions.yaml marks ``device_check: NoCheck``."""
    ops: list[str] = []
    current = None
    for line in yaml_text.splitlines():
        if line.startswith("- func:"):
            current = line[len("- func:") :].strip().split("(", 1)[0]
        elif current is not None and line.strip().split("#", 1)[0].strip() == "device_check: NoCheck":
            ops.append(current)
    return ops


def _write_device_checks(workdir: Path) -> Path:
    ops = no_device_check_ops(_native_functions_yaml().read_text())
    source = workdir / "device_checks.cpp"
    body = ",\n".join(f'    "{op}"' for op in ops)
    source.write_text(
        "// Generated by lightning_xpu/emulator/_build.py from torch's native_functions.yaml: device_check: NoCheck.\n"
        "#include <cstddef>\n\nnamespace xpu_emu {\n"
        f"extern const char* const kNoDeviceCheckOps[] = {{\n{body}\n}};\n"
        f"extern const size_t kNoDeviceCheckOpCount = {len(ops)};\n"
        "}  // namespace xpu_emu\n"
    )
    return source


def _write_units(workdir: Path) -> list[Path]:
    """A ``unit_<name>.cpp`` per entry of ``_UNITS`` that includes its sources by path (diagnostics name them)."""
    units = []
    for name, sources in _UNITS:
        unit = workdir / f"unit_{name}.cpp"
        includes = "".join(f'#include "{_CSRC / source}"\n' for source in sources)
        unit.write_text(f"// Generated by lightning_xpu/emulator/_build.py: one translation unit.\n{includes}")
        units.append(unit)
    return units


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
    # the small generated source first: it is done in a second, leaving a core to each unit
    sources = (_write_device_checks(workdir), *_write_units(workdir))
    objects = [workdir / (source.stem + ".o") for source in sources]
    compiles = [[cxx, *cflags, "-c", str(src), "-o", str(obj)] for src, obj in zip(sources, objects, strict=True)]
    lib_dir = os.path.abspath(os.path.join(os.path.dirname(cpp_extension.__file__), os.pardir, "lib"))
    link = [cxx, "-shared", *map(str, objects), "-o", str(output), f"-L{lib_dir}"]
    link += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return compiles, link


def _say(stream: IO[str], text: str) -> None:
    print(f"XPU emulator: {text}", file=stream, flush=True)


def _run(commands: Sequence[list[str]], cxx: str, verbose: bool, stream: IO[str], started: float) -> None:
    """Run the commands, one per core, saying every ``PROGRESS_INTERVAL_S`` seconds that they are still running."""
    if verbose:
        for command in commands:
            print(" ".join(shlex.quote(c) for c in command), file=stream)
    # one compiler per core: each takes up to 1 GB for torch's headers
    with ThreadPoolExecutor(max_workers=min(len(commands), os.cpu_count() or 1)) as pool:
        pending: set[Future[subprocess.CompletedProcess[str]]] = {
            pool.submit(subprocess.run, command, capture_output=True, text=True) for command in commands
        }
        futures = list(pending)
        last = time.monotonic()
        while pending:
            _, pending = wait(pending, timeout=max(0.0, last + PROGRESS_INTERVAL_S - time.monotonic()),
                              return_when=FIRST_COMPLETED)
            if pending and time.monotonic() - last >= PROGRESS_INTERVAL_S:
                done = len(futures) - len(pending)
                _say(stream, f"still compiling ({time.monotonic() - started:.0f} s; {done} of {len(futures)} "
                             "compiler runs done)")
                last = time.monotonic()
    failures = [result.stderr[-4000:] for result in (f.result() for f in futures) if result.returncode != 0]
    if failures:
        raise EmulatorBuildError(f"Building the XPU emulator failed ({cxx}):\n" + "\n".join(failures))


def _why(target: Path) -> str:
    """Why this build happens: the first one in this cache, a new torch (or Python), or a changed emulator source."""
    import torch

    others = [p.name for p in target.parent.parent.glob("torch-*") if p != target.parent and p.is_dir()]
    same_torch = target.parent.name.rsplit("-", 1)[0]
    if any(name.rsplit("-", 1)[0] == same_torch for name in others):
        return "its source changed since its last build for this torch, as after an update of lightning-xpu"
    if others:
        return f"first use with torch {torch.__version__} on Python {sys.version_info[0]}.{sys.version_info[1]}"
    return "first use on this machine"


def _lock_holder(lock: IO[str]) -> str:
    lock.seek(0)
    pid = lock.read().strip()
    return f"process {pid}" if pid.isdigit() else "another process"


def build(verbose: bool = False, stream: IO[str] | None = None) -> Path:
    """Compile the native part into the cache unless it is there already; return the library's path.

    Progress goes to ``stream`` (stderr): what is built and why, then a line at least every ``PROGRESS_INTERVAL_S``
    seconds. A process that finds another one building waits for it, saying so once.
    """
    target = library_path()
    if target.exists():
        return target
    import fcntl  # POSIX only, like the emulator itself

    stream = sys.stderr if stream is None else stream
    target.parent.mkdir(parents=True, exist_ok=True)
    # "a+": opening must not truncate the holder's pid, which the waiters read
    with open(target.parent / "build.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(stream, f"waiting for {_lock_holder(lock)}, which is compiling the native part into {target.parent}")
            fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if the holder dies
        if target.exists():  # another process built it while we waited
            return target
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        cxx = _compiler()
        import torch

        started = time.monotonic()
        cores = os.cpu_count() or 1
        _say(stream, f"compiling its native part for torch {torch.__version__} ({_why(target)}; once per torch "
                     f"build, then loaded from {cache_dir()}). This takes about {_EXPECTED_WALL_S} s on two idle "
                     f"cores (this machine has {cores}), longer on a busy machine.")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            partial = Path(tmp) / target.name
            compiles, link = _compile_commands(cxx, Path(tmp), partial)
            _run(compiles, cxx, verbose, stream, started)
            _run([link], cxx, verbose, stream, started)
            os.replace(partial, target)
        _say(stream, f"built in {time.monotonic() - started:.0f} s: {target}")
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
