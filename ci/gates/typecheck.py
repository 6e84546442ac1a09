"""mypy as upstream's ``.github/workflows/code-checks.yml`` runs it, and the errors a pull request adds.

The workflow installs Lightning with its ``pytorch-all`` and ``fabric-all`` extras and ``requirements/typing.txt``
(mypy 1.20.0, torch 2.9.1 and type stubs) on Python 3.11, then runs a bare ``mypy`` from the checkout's root: the
files and options come from ``[tool.mypy]`` in ``pyproject.toml``. Here:

- torch is installed ``--no-deps``: mypy reads its Python sources and stubs only, so PyPI's CUDA build (taken where
  PyTorch's CPU index, tried first, is unreachable) needs none of its NVIDIA libraries. A probe checks that mypy then
  sees torch's real types (``torch.ones`` returns ``Tensor``).
  The other packages that require torch (torchmetrics) are installed ``--no-deps`` too, or pip would pull a torch
  with its NVIDIA libraries back in.
- the extras are installed as far as they install without torch's NVIDIA libraries: ``deepspeed`` builds against an
  importable torch, ``bitsandbytes`` and ``torchvision`` require torch with its libraries, ``ipython`` is not imported
  by ``src/lightning``. They are left out, and mypy reads them as missing imports, which upstream's
  ``ignore_missing_imports`` makes ``Any``: an error in code that uses their types may go unseen (the report names
  them).
- one cache directory serves every run, so after the base only the modules a pull request changes (and those that
  depend on them) are checked again.

Errors are compared by file and message (with the error code), not line: lines move between the base and a pull
request's end.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ci.gates.venvs import TORCH_CPU_INDEX
from lightning_xpu.errors import ToolError

# the extras' requirement files upstream's workflow installs (`.[pytorch-all,fabric-all]`) beside the base ones
REQUIREMENT_FILES = [f"requirements/{pkg}/{name}.txt" for pkg in ("fabric", "pytorch")
                     for name in ("base", "extra", "strategies", "examples")]
# packages that require torch: installed without their dependencies, so that pip keeps torch 2.9.1 without NVIDIA's
NO_DEPS = {"torch", "torchmetrics"}
LEFT_OUT = {
    "deepspeed": "builds against an importable torch",
    "bitsandbytes": "requires torch with its NVIDIA libraries",
    "torchvision": "requires torch with its NVIDIA libraries",
    "ipython": "not imported by src/lightning",
}
_ERROR = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+)(?::\d+)?: error: (?P<message>.*)$")
PROBE = "import torch\n\nprobe: int = torch.ones(1)\n"
PROBE_EXPECTED = 'expression has type "Tensor"'


@dataclass(frozen=True)
class MypyError:
    file: str
    line: int
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return self.file, self.message

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: error: {self.message}"


def requirement_steps(tree: Path, typing: tuple[str, ...]) -> tuple[list[list[str]], list[str]]:
    """The pip steps of the mypy environment for the base ``tree``, and the requirements left out (with why)."""
    plain: list[str] = []
    no_deps: list[str] = []
    left_out: list[str] = []
    lines = list(typing)
    for rel in REQUIREMENT_FILES:
        path = tree / rel
        if path.is_file():
            lines += [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    for req in dict.fromkeys(filter(None, lines)):
        name = re.split(r"[=<>!~ \[;]", req, maxsplit=1)[0].lower()
        if name in LEFT_OUT:
            left_out.append(f"{req} ({LEFT_OUT[name]})")
        elif name in NO_DEPS:
            if name != "torch" or "==" in req:  # the base's `torch >=2.1` ranges give way to typing.txt's pin
                no_deps.append(req)
        else:
            plain.append(req.replace(",jsonnet", "").replace("jsonnet,", ""))  # jsonnet: a C++ build, no types
    return [plain, ["--no-deps", *TORCH_CPU_INDEX, *no_deps]], left_out


def parse_errors(output: str) -> list[MypyError]:
    errors = []
    for line in output.splitlines():
        if m := _ERROR.match(line):
            errors.append(MypyError(m.group("file"), int(m.group("line")), m.group("message").strip()))
    return errors


def run_mypy(python: Path, tree: Path, cache: Path) -> list[MypyError]:
    """A bare ``mypy`` in ``tree`` (its ``[tool.mypy]``), with ``cache`` as its incremental cache."""
    proc = subprocess.run([str(python), "-m", "mypy", "--cache-dir", str(cache)], cwd=tree, capture_output=True,
                          text=True)
    if proc.returncode not in (0, 1):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise ToolError(f"mypy crashed in {tree} (exit {proc.returncode}):\n{tail}")
    # mypy writes its errors to stderr when `install_types` is on (upstream's setting), the summary to stdout
    return parse_errors(proc.stdout + "\n" + proc.stderr)


def probe_torch(python: Path, scratch: Path) -> str:
    """Check that mypy sees torch's types (not ``Any``) in this environment; return torch's version."""
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "probe.py").write_text(PROBE)
    proc = subprocess.run([str(python), "-m", "mypy", "--no-incremental", "--config-file", "/dev/null",
                           "probe.py"], cwd=scratch, capture_output=True, text=True)
    if PROBE_EXPECTED not in proc.stdout + proc.stderr:
        raise ToolError("mypy does not see torch's types in its environment (a probe assigning torch.ones(1) to an "
                        f"int was not refused): {proc.stdout.strip() or proc.stderr.strip()}; remove the mypy "
                        "environment and run again")
    version = subprocess.run([str(python), "-c", "from importlib.metadata import version; print(version('torch'))"],
                             capture_output=True, text=True)
    return version.stdout.strip()


def new_errors(base: list[MypyError], end: list[MypyError]) -> list[MypyError]:
    """The errors at a pull request's end that the base does not have (same file and message, counted)."""
    left = Counter(e.key for e in base)
    new = []
    for error in end:
        if left[error.key]:
            left[error.key] -= 1
        else:
            new.append(error)
    return new
