"""No install of torch in this repository can resolve to a CUDA build, except the listed ones, each with its reason.

PyPI's Linux torch wheels are CUDA builds (gigabytes of NVIDIA libraries, and the emulator refuses them); the set-up
commands, the CPU tox environments and the docs' commands need the CPU build. A torch requirement is safe when it pins
a local version of a build that is not CUDA's (``torch==2.13.0+cpu``: only PyTorch's CPU index, or a wheel found
through find-links, has it), when its pip command's only index is one of PyTorch's CPU or XPU indexes
(``--index-url https://download.pytorch.org/whl/xpu``), or when pip reads no index at all (``--no-index``). Anything
else may take PyPI's CUDA build and must be in ``EXCEPTIONS`` with its reason.

Scanned: tox.ini (every environment's deps under its install_command, and pip commands in its commands), the shell
scripts (ci/, .ci/run), pip requirement and constraint files in ci/, the string constants of the Python files (ci/,
lightning_xpu/, tests/, benchmarks/, examples/: messages that tell users what to run, commands tests run), the
Markdown pages (code blocks and code spans) and the GitHub workflows. The series (patches/) is upstream's code and not
scanned.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

from .conftest import REPO

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# PyTorch's indexes that hold no CUDA build: cpu and xpu, release, nightly and test channels
_NON_CUDA_INDEX = re.compile(r"https://download\.pytorch\.org/whl/(?:nightly/|test/)?(?:cpu|xpu)/?$")

# (file, the requirement or pip argument as written) -> why it may resolve to a CUDA build, and why that is fine.
# Environments that need a particular torch from PyPI join here (the upstream-gates environment's torch 2.1.2 and 2.9.1,
# for instance), each with a line that says what the CUDA build is used for.
EXCEPTIONS: dict[tuple[str, str], str] = {
    **{
        ("tox.ini", f"torch=={version}"): (
            "the torch matrix of the mocked tier (series-mocked-torch*): the CPU build of this release exists only on "
            "PyTorch's CPU index, which install_command adds and pip prefers (test_pip_prefers_the_cpu_build_...); "
            "where that index is unreachable (this project's CI) pip takes PyPI's CUDA build, harmless in the mocked "
            "tier, which mocks XPU counts and never loads the emulator or a GPU"
        )
        for version in ("2.8.0", "2.14.1", "2.15.0")
    },
    ("ci/main-job.sh", "--index-url $TORCH_INDEX_URL"): (
        "TORCH_INDEX_URL names the index the user asks for (the script and README: PyTorch's XPU index); without it "
        "the job installs torch==2.13.0+cpu"
    ),
    ("ci/gates/venvs.py", "$expr"): (
        "upstream-gates' environments (ci/gates/): the steps that install torch (2.1.2, the oldest release of "
        "upstream's matrix, for its CPU tests; 2.9.1 --no-deps for mypy) put PyTorch's CPU index beside PyPI "
        "(TORCH_CPU_INDEX), so pip takes the CPU build where that index is reachable and PyPI's CUDA build where it "
        "is not (this project's CI): the tests run with CUDA_VISIBLE_DEVICES empty, as upstream's CPU workflows, and "
        "mypy reads only its types; neither loads the emulator"
    ),
    ("ci/intel/install_torch.sh", "--index-url $index"): (
        "the real-hardware tier's torch: the script sets $index to PyTorch's XPU index (release or nightly) and "
        "refuses a torch that is not an XPU build right after installing it"
    ),
}


@dataclass(frozen=True)
class Install:
    """One torch requirement (or an argument that may be one) and the indexes its pip command reads."""

    path: str
    line: int
    requirement: str
    index_url: str | None  # None: PyPI
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False

    def may_be_cuda(self) -> bool:
        if self.no_index:
            return False
        try:
            pins = [s for s in Requirement(self.requirement).specifier if s.operator in ("==", "===")]
        except InvalidRequirement:  # a variable: what it installs is not known here
            pins = []
        if pins and all("+" in s.version and not s.version.split("+", 1)[1].startswith("cu") for s in pins):
            return False  # a local version of a CPU/XPU/ROCm build: no CUDA build matches it
        indexes = [self.index_url, *self.extra_index_urls]
        return not all(url is not None and _NON_CUDA_INDEX.match(url) for url in indexes)


# pip install's options that take a value (the value is not a requirement)
_VALUED = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url", "--extra-index-url", "-f",
    "--find-links", "-t", "--target", "--prefix", "--root", "--retries", "--timeout", "--python-version", "--platform",
    "--implementation", "--abi", "--src", "--upgrade-strategy", "--progress-bar", "--report", "--config-settings",
    "-C", "--global-option", "--no-binary", "--only-binary", "--cache-dir", "--log", "--proxy", "--trusted-host",
    "--cert", "--client-cert", "--exists-action", "--python",
}


def _is_torch(token: str) -> bool:
    if token.startswith("$"):
        return True  # a variable may hold a torch requirement
    try:
        return Requirement(token).name.lower() == "torch"
    except InvalidRequirement:
        return False


def pip_installs(path: str, line: int, tokens: list[str], defaults: tuple[str, ...] = ()) -> list[Install]:
    """The torch requirements of one pip command (``tokens`` from ``install`` on), under ``defaults`` options."""
    index_url, extras, no_index = None, [], False
    positional = []
    args = [*defaults, *tokens[1:]]
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in _VALUED:
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            if name in ("-i", "--index-url"):
                index_url = value
            elif name == "--extra-index-url":
                extras.append(value)
            elif name in ("-r", "--requirement", "-c", "--constraint"):
                positional += [req for req in _requirement_file(value) if _is_torch(req)]
        elif arg == "--no-index":
            no_index = True
        elif not arg.startswith("-") and _is_torch(arg):
            positional.append(arg)
        i += 1
    # "--index-url $X": the index is a variable; report it as written
    if index_url is not None and index_url.startswith("$"):
        return [Install(path, line, f"--index-url {index_url}", index_url, tuple(extras), no_index)]
    return [Install(path, line, req, index_url, tuple(extras), no_index) for req in positional]


def _requirement_file(name: str) -> list[str]:
    """The requirements of a file in this repository (requirement files are scanned on their own too)."""
    path = REPO / name
    if not path.is_file():
        return []
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "-"))]


def _shell_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line, tokens from ``install`` on) of every ``pip install`` in shell text; lines continued with ``\\`` joined."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, line = i + 1, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        for match in re.finditer(r"\bpip3?\b(?:\s+-\S+)*\s+(install\b[^;&|)`\n]*)", line):
            try:
                tokens = shlex.split(match.group(1), comments=True)
            except ValueError:  # an unbalanced quote inside prose
                tokens = match.group(1).split()
            found.append((start, tokens))
    return found


def _tox_installs(path: Path) -> list[Install]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(path)
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text()
    installs = []
    for section in config.sections():
        command = config.get(section, "install_command", fallback=None) or config.get("testenv", "install_command")
        defaults = tuple(shlex.split(command.split(" install ", 1)[1].replace("{opts}", "").replace("{packages}", "")))
        for dep in config.get(section, "deps", fallback="").splitlines():
            dep = re.sub(r"^[!\w,-]+:\s+", "", dep.strip())  # a factor condition ("torch28: ")
            if not dep or dep.startswith("{"):  # {[testenv]deps}: checked in its own section
                continue
            tokens = ["install", *shlex.split(dep)]
            lines = enumerate(text.splitlines(), 1)
            line = next((n for n, t in lines if t[:1].isspace() and t.strip().endswith(dep)), 0)
            installs += pip_installs(rel, line, tokens, defaults)
        for key in ("commands_pre", "commands"):
            for _, tokens in _shell_commands(config.get(section, key, fallback="")):
                installs += pip_installs(rel, 0, tokens)
    return installs


def _requirements_file_installs(path: Path) -> list[Install]:
    rel = path.relative_to(REPO).as_posix()
    options = [line.strip() for line in path.read_text().splitlines() if line.strip().startswith("-")]
    defaults = tuple(token for option in options for token in shlex.split(option))
    return [install for n, req in enumerate(path.read_text().splitlines(), 1)
            if req.strip() and not req.lstrip().startswith(("#", "-")) and _is_torch(req.split("#")[0].strip())
            for install in pip_installs(rel, n, ["install", req.split("#")[0].strip()], defaults)]


def _python_installs(path: Path) -> list[Install]:
    """pip commands in string constants and f-strings (a module-level string constant filled in, any other value a
    ``$variable``), and in list displays of string constants (``["pip", "install", ...]``)."""
    rel = path.relative_to(REPO).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return str(node.value)
        if isinstance(node, ast.FormattedValue) and isinstance(node.value, ast.Name) and node.value.id in constants:
            return constants[node.value.id]
        return "$expr"

    installs = []
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        strings = []
        if isinstance(node, ast.JoinedStr):
            strings = ["".join(text(part) for part in node.values)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings:
            strings = [node.value]
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if "pip" in words and "install" in words[words.index("pip"):]:
                installs += pip_installs(rel, node.lineno, words[words.index("install", words.index("pip")):])
        for string in strings:
            for offset, tokens in _shell_commands(string):
                installs += pip_installs(rel, node.lineno + offset - 1, tokens)
    return installs


def _markdown_installs(path: Path) -> list[Install]:
    """pip commands in fenced code blocks and code spans."""
    rel = path.relative_to(REPO).as_posix()
    installs, fenced = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        code = [line] if fenced else re.findall(r"`([^`]+)`", line)
        for span in code:
            installs += [i for _, tokens in _shell_commands(span) for i in pip_installs(rel, n, tokens)]
    return installs


def _workflow_installs(path: Path) -> list[Install]:
    rel = path.relative_to(REPO).as_posix()
    return [i for n, tokens in _shell_commands(path.read_text()) for i in pip_installs(rel, n, tokens)]


def repo_torch_installs(repo: Path = REPO) -> list[Install]:
    """Every torch install of the repository outside the series."""
    installs = _tox_installs(repo / "tox.ini")
    for path in sorted({*repo.glob("ci/**/*.sh"), repo / ".ci" / "run"}):
        rel = path.relative_to(repo).as_posix()
        installs += [i for n, tokens in _shell_commands(path.read_text()) for i in pip_installs(rel, n, tokens)]
    for path in sorted(repo.glob("ci/**/*.txt")):
        installs += _requirements_file_installs(path)
    for top in ("ci", "lightning_xpu", "tests", "benchmarks", "examples"):
        for path in sorted((repo / top).glob("**/*.py")):
            if path != Path(__file__).resolve():  # this file's examples of bad installs
                installs += _python_installs(path)
    pages = [repo / "README.md", *repo.glob("docs/*.md"), *repo.glob("ci/**/*.md"), *repo.glob("lightning_xpu/**/*.md"),
             *repo.glob("benchmarks/**/*.md")]
    for path in sorted(pages):
        installs += _markdown_installs(path)
    for path in sorted(repo.glob("ci/github/workflows/*.yml")):
        installs += _workflow_installs(path)
    return installs


def test_no_torch_install_can_resolve_to_a_cuda_build() -> None:
    installs = repo_torch_installs()
    assert len(installs) >= 10, installs  # the scan finds the installs it is about
    risky = sorted({f"{i.path}:{i.line}: {i.requirement}" for i in installs
                    if i.may_be_cuda() and (i.path, i.requirement) not in EXCEPTIONS})
    assert risky == [], "pin the CPU build (torch==X+cpu, PyTorch's CPU index as extra index), or add to EXCEPTIONS"


def test_every_exception_is_still_an_install_of_the_repository() -> None:
    found = {(i.path, i.requirement) for i in repo_torch_installs() if i.may_be_cuda()}
    assert sorted(set(EXCEPTIONS) - found) == []


def test_the_tox_environments_and_the_main_job_install_the_cpu_build() -> None:
    installs = repo_torch_installs()
    cpu = {(i.path, i.requirement, i.extra_index_urls) for i in installs}
    assert ("tox.ini", "torch==2.13.0+cpu", (CPU_INDEX,)) in cpu
    assert ("ci/main-job.sh", "torch==2.13.0+cpu", (CPU_INDEX,)) in cpu
    # the torch matrix's pins read the CPU index too: they take its CPU builds wherever it is reachable
    assert {(i.requirement, i.extra_index_urls) for i in installs if i.requirement == "torch==2.8.0"} == {
        ("torch==2.8.0", (CPU_INDEX,))}


@pytest.mark.parametrize(
    ("command", "cuda"),
    [
        ("pip install torch==2.13.0", True),
        ("pip install torch", True),
        ("python -m pip install --quiet torch>=2.8 ninja", True),
        ("pip install torch==2.8.0 --extra-index-url https://download.pytorch.org/whl/cpu", True),
        ("pip install torch==2.13.0+cu126", True),
        ("pip install torch --index-url $TORCH_INDEX_URL", True),
        ("pip install $spec --index-url https://download.pytorch.org/whl/cu126", True),
        ("pip install torch==2.13.0+cpu", False),
        ("pip install --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu", False),
        ("pip install torch --index-url https://download.pytorch.org/whl/xpu", False),
        ("pip install --pre torch --index-url https://download.pytorch.org/whl/nightly/xpu", False),
        ("pip install torch==2.13.0 -i https://download.pytorch.org/whl/cpu", False),
        ("pip install --no-index --find-links wheels torch", False),
    ],
)
def test_the_check_tells_a_cuda_capable_install(command: str, cuda: bool) -> None:
    (_, tokens), = _shell_commands(command)
    (install,) = pip_installs("x.sh", 1, tokens)
    assert install.may_be_cuda() is cuda


def test_the_check_reads_commands_out_of_prose_and_code() -> None:
    text = "run `pip install torch==2.13.0`, or pip install torch --index-url https://download.pytorch.org/whl/xpu)"
    assert [tokens for _, tokens in _shell_commands(text)] == [
        ["install", "torch==2.13.0"], ["install", "torch", "--index-url", "https://download.pytorch.org/whl/xpu"]]
    assert [t for _, t in _shell_commands("python -m pip install ninja . && pip install \\\n  torch")] == [
        ["install", "ninja", "."], ["install", "torch"]]
    assert [t for _, t in _shell_commands("pip uninstall -y torch")] == []


def _fake_index(index: Path, version: str) -> None:
    """A file:// index holding one torch wheel with only its metadata: enough for pip to choose between versions."""
    directory = index / "torch"
    directory.mkdir(parents=True)
    info = f"torch-{version}.dist-info"
    name = f"torch-{version}-py3-none-any.whl"
    (directory / "index.html").write_text(f'<a href="{name}">{name}</a>\n')  # pip reads a file:// index's index.html
    with zipfile.ZipFile(directory / name, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")


def _pip_choice(tmp_path: Path, requirement: str, index: Path, extra: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's find-links and indexes stay out
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "--report", str(report), "--index-url", index.as_uri(),
                    "--extra-index-url", extra.as_uri(), requirement], env=env, check=True, capture_output=True)
    (chosen,) = json.loads(report.read_text())["install"]
    return chosen["metadata"]["version"]


def test_pip_prefers_the_cpu_build_where_the_cpu_index_is_reachable(tmp_path: Path) -> None:
    # PyPI holds torch 2.8.0 (a CUDA build on Linux), PyTorch's CPU index 2.8.0+cpu; both are file:// indexes here.
    # `torch==2.8.0` matches both, and pip takes the higher version: PEP 440 sorts 2.8.0+cpu after 2.8.0.
    pypi, cpu = tmp_path / "pypi", tmp_path / "cpu"
    _fake_index(pypi, "2.8.0")
    _fake_index(cpu, "2.8.0+cpu")
    assert _pip_choice(tmp_path, "torch==2.8.0", pypi, cpu) == "2.8.0+cpu"
    assert _pip_choice(tmp_path, "torch==2.8.0", cpu, pypi) == "2.8.0+cpu"  # whichever index is the extra one
    # where the index is unreachable only PyPI's build is left (what the torch matrix gets in this CI); a +cpu pin
    # then finds nothing on PyPI: the CPU environments' wheel comes from find-links
    (tmp_path / "empty" / "torch").mkdir(parents=True)
    (tmp_path / "empty" / "torch" / "index.html").write_text("")
    assert _pip_choice(tmp_path, "torch==2.8.0", pypi, tmp_path / "empty") == "2.8.0"
