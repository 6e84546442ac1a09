"""Building the native part: one compile per cache key even when processes race, clear errors."""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from lightning_xpu.emulator import _build

REPO_ROOT = Path(__file__).resolve().parents[2]

# Stands in for the C++ compiler: logs each call, takes a moment, and writes the requested output file.
_FAKE_CXX = """#!{python}
import sys, time
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
time.sleep(1.0)
out = sys.argv[sys.argv.index("-o") + 1]
open(out, "w").write("fake")
"""


def _env(tmp_path: Path, cxx: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_XPU_EMULATOR")}
    env.update(
        CXX=cxx,
        LIGHTNING_XPU_EMULATOR_CACHE=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]),
        PYTHONWARNINGS="ignore",
    )
    return env


def test_concurrent_builds_compile_once(tmp_path):
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(_FAKE_CXX.format(python=sys.executable, log=str(log)))
    cxx.chmod(0o755)
    code = "from lightning_xpu import emulator; print(emulator.build())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=_env(tmp_path, str(cxx)), stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(paths) == 1
    built = Path(paths.pop())
    assert built.read_text() == "fake" and built.parent.parent == tmp_path / "cache"
    calls = log.read_text().splitlines()
    sources = len(_build._SOURCES) + 1  # and the generated device_checks.cpp
    assert len(calls) == sources + 1  # each source and one link, by one process only
    assert sum(" -c " in f" {c} " for c in calls) == sources
    assert not [p for p in built.parent.iterdir() if p.name.startswith("tmp")]  # no half-built leftovers


def test_missing_compiler_is_a_clear_error(tmp_path):
    code = textwrap.dedent(
        """
        from lightning_xpu import emulator
        try:
            emulator.build()
        except emulator.EmulatorBuildError as e:
            print(e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(tmp_path, "no-such-compiler"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "needs a C++ compiler" in out and "'no-such-compiler' was not found" in out


def test_status_report_says_emulated(run_emulated):
    out = run_emulated(
        """
        import runpy, sys
        sys.argv = ["lightning_xpu.emulator"]
        try:
            runpy.run_module("lightning_xpu.emulator", run_name="__main__")
        except SystemExit as e:
            assert e.code == 0
        """,
        profile="b580",
    )
    lines = out.splitlines()
    assert lines[0].startswith("XPU emulator: on, 2 emulated device(s)")
    assert lines[1].split() == [
        "xpu:0",
        "Intel(R)",
        "Arc(TM)",
        "B580",
        "Graphics",
        "(emulated)",
        "12",
        "GiB",
        "fp64=yes",
    ]


def test_the_generated_table_is_part_of_the_build_key(tmp_path, monkeypatch):
    assert _build._CSRC / "deterministic_alerts.inc" in _build._INCLUDES
    table = tmp_path / "deterministic_alerts.inc"
    table.write_text("// one table\n")
    monkeypatch.setattr(_build, "_INCLUDES", (table,))
    before = _build._build_key()
    table.write_text("// another table\n")
    assert _build._build_key() != before


def test_every_source_and_local_include_is_built_and_in_the_build_key():
    # a new .cpp left out of _SOURCES is not compiled; a header left out of _INCLUDES would not rebuild when edited
    sources = set(_build._CSRC.glob("*.cpp"))
    assert set(_build._SOURCES) == sources
    assert len(_build._SOURCES) == len(sources)  # each once
    included = set()
    for path in (*sources, *_build._INCLUDES):
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), flags=re.MULTILINE):
            included.add(path.parent / name)
    assert included, "the sources include their shared header"
    assert included <= set(_build._INCLUDES), sorted(p.name for p in included - set(_build._INCLUDES))


def test_every_native_source_ships_in_the_package():
    # an installed (non-editable) lightning-xpu builds from its package data: a file left out cannot be compiled
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    globs = [g.strip() for g in config["options.package_data"]["lightning_xpu.emulator"].split(",")]
    package = _build._CSRC.parent
    needed = [p.relative_to(package).as_posix() for p in (*_build._SOURCES, *_build._INCLUDES)]
    assert [n for n in needed if not any(fnmatch.fnmatch(n, g) for g in globs)] == []


def test_the_operators_without_a_device_check_come_from_native_functions_yaml():
    yaml = (
        "- func: add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor\n"
        "  device_check: NoCheck   # TensorIterator\n"
        "  structured_delegate: add.out\n\n"
        "- func: index_select(Tensor self, int dim, Tensor index) -> Tensor\n"
        "  variants: method, function\n\n"
        "- func: copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)\n"
        "  device_check: NoCheck\n"
    )
    assert _build.no_device_check_ops(yaml) == ["add.Tensor", "copy_"]
    # the running torch's own file: TensorIterator's binary operators take CPU scalars, index_select does not
    ops = _build.no_device_check_ops(_build._native_functions_yaml().read_text())
    assert "add.Tensor" in ops and "where.self" in ops
    assert "index_select" not in ops
