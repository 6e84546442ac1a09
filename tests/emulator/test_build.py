"""Building the native part: one compile per cache key when processes race, progress while it runs, clear errors."""

from __future__ import annotations

import configparser
import fnmatch
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_xpu.emulator import _build

REPO_ROOT = Path(__file__).resolve().parents[2]

# Stands in for the C++ compiler: logs each call, takes FAKE_CXX_SLEEP seconds (default 1), and writes the requested
# output file; the link writes a copy of FAKE_CXX_LIBRARY where that is set (a real build, so that it loads).
_FAKE_CXX = """#!{python}
import os, shutil, sys, time
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
time.sleep(float(os.environ.get("FAKE_CXX_SLEEP", "1")))
out = sys.argv[sys.argv.index("-o") + 1]
if "-shared" in sys.argv and os.environ.get("FAKE_CXX_LIBRARY"):
    shutil.copyfile(os.environ["FAKE_CXX_LIBRARY"], out)
else:
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


def _fake_cxx(tmp_path: Path) -> tuple[Path, Path]:
    """The fake compiler and the log of its calls."""
    log = tmp_path / "cxx.log"
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(_FAKE_CXX.format(python=sys.executable, log=str(log)))
    cxx.chmod(0o755)
    return cxx, log


def test_concurrent_builds_compile_once_and_only_the_builder_reports_progress(tmp_path):
    cxx, log = _fake_cxx(tmp_path)
    code = "import os; from lightning_xpu import emulator; print(os.getpid(), emulator.build())"
    # each compiler run takes 3 s: the lock is held long enough for the other two processes to find it taken
    env = {**_env(tmp_path, str(cxx)), "FAKE_CXX_SLEEP": "3"}
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, **pipes) for _ in range(3)]
    outs = [(p.communicate(timeout=120), p.returncode) for p in procs]
    assert [rc for _, rc in outs] == [0, 0, 0], [err for (_, err), _ in outs]
    pids = [out.split()[0] for (out, _), _ in outs]
    paths = {out.split()[1] for (out, _), _ in outs}
    assert len(paths) == 1
    built = Path(paths.pop())
    assert built.read_text() == "fake" and built.parent.parent == tmp_path / "cache"
    calls = log.read_text().splitlines()
    units = len(_build._UNITS) + 1  # and the generated device_checks.cpp
    assert len(calls) == units + 1  # each unit and one link, by one process only
    assert sum(" -c " in f" {c} " for c in calls) == units
    assert not [p for p in built.parent.iterdir() if p.name.startswith("tmp")]  # no half-built leftovers
    # progress from the builder alone; the others say once that they wait, naming it
    errs = [err for (_, err), _ in outs]
    builders = [pid for pid, err in zip(pids, errs, strict=True) if "compiling its native part" in err]
    assert len(builders) == 1
    waiting = [err for err in errs if "compiling its native part" not in err]
    assert waiting == [f"XPU emulator: waiting for process {builders[0]}, which is compiling the native part into "
                       f"{built.parent}\n"] * 2


def test_a_build_says_what_it_builds_why_how_long_and_that_it_is_still_running(tmp_path, monkeypatch):
    cxx, _ = _fake_cxx(tmp_path)
    for name, value in _env(tmp_path, str(cxx)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FAKE_CXX_SLEEP", "1.2")
    monkeypatch.setattr(_build, "PROGRESS_INTERVAL_S", 0.5)
    import torch

    stream = io.StringIO()
    built = _build.build(stream=stream)
    lines = stream.getvalue().splitlines()
    assert lines[0] == (
        f"XPU emulator: compiling its native part for torch {torch.__version__} (first use on this machine; once per "
        f"torch build, then loaded from {tmp_path / 'cache'}). This takes about {_build._EXPECTED_WALL_S} s on two "
        f"idle cores (this machine has {os.cpu_count()}), longer on a busy machine."
    )
    still = lines[1:-1]
    assert len(still) >= 2, lines  # 2.4 s or more of compiling and linking, a line every 0.5 s
    assert all(re.fullmatch(r"XPU emulator: still compiling \(\d+ s; \d of \d compiler runs done\)", x) for x in still)
    assert re.fullmatch(rf"XPU emulator: built in \d+ s: {re.escape(str(built))}", lines[-1])

    stream = io.StringIO()
    assert _build.build(stream=stream) == built and stream.getvalue() == ""  # built: silent


@pytest.mark.parametrize(
    ("earlier", "why"),
    [
        ([], "first use on this machine"),
        (["torch-1.0.0+cpu-py39-0123456789abcdef"], "first use with torch {torch} on Python {python}"),
        (["{same}-0123456789abcdef"], "its source changed since its last build for this torch"),
    ],
)
def test_a_build_says_why_it_happens(tmp_path, monkeypatch, earlier, why):
    import torch

    monkeypatch.setenv("LIGHTNING_XPU_EMULATOR_CACHE", str(tmp_path))
    target = _build.library_path()
    for name in earlier:
        (tmp_path / name.format(same=target.parent.name.rsplit("-", 1)[0])).mkdir()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert _build._why(target).startswith(why.format(torch=torch.__version__, python=python))


def test_the_first_import_under_the_emulator_variable_shows_the_build(tmp_path, emulator_site):
    # the start-up hook builds inside `import torch` (and so inside `lightning-xpu doctor`): its progress must show
    real = _build.build()  # the session's real library: the fake link copies it, so that it loads
    cxx, _ = _fake_cxx(tmp_path)
    env = {
        **_env(tmp_path, str(cxx)),
        "FAKE_CXX_LIBRARY": str(real),
        "FAKE_CXX_SLEEP": "0",
        "LIGHTNING_XPU_EMULATOR": "2",
        "PYTHONPATH": os.pathsep.join([str(emulator_site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.xpu.device_count())"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "2\n"
    assert "XPU emulator: compiling its native part for torch" in proc.stderr
    assert re.search(r"^XPU emulator: built in \d+ s: ", proc.stderr, flags=re.M)


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
