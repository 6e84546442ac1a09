"""Fold the series' test files into their upstream namesakes, for the master variant.

The release series adds its tests as new files (the sdist ships no tests). Upstream would keep most of them in the
file that tests the same module: ``tests_pytorch/utilities/test_memory_xpu.py`` belongs in ``test_memory.py``,
``test_ddp_side_stream.py`` in ``test_ddp.py`` (``namesake_of``). Here a test file is folded into its namesake (its
tests and helpers appended, its imports merged into the namesake's block) when nothing in it would change the
namesake's other tests: it defines no autouse fixture and no ``pytestmark``, and no name the namesake also defines.
The others stay separate files, as do files without a namesake (``accelerators/test_xpu.py``).

``lightning-xpu port`` folds each patch's test files right after applying it (and takes a folded file's body out of
the namesake again before a later patch changes that file), so each patch of the master variant changes the namesake
the way the release patch changes the separate file. Imports are sorted and the result formatted with ruff under
upstream's rules (``ci/ruff-upstream.toml``), so the fold is the same on every machine with the same ruff.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.errors import ToolError

RUFF_CONFIG = Path(__file__).resolve().parent.parent / "ci" / "ruff-upstream.toml"


@dataclass(frozen=True)
class Fold:
    """One test file and the namesake it is folded into (paths relative to the tree), or why it stays separate."""

    path: str
    namesake: str
    reason: str = ""  # empty when it is folded

    @property
    def folds(self) -> bool:
        return not self.reason


def _top_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def namesake_of(path: str, root: Path) -> str:
    """The upstream file in ``root`` that the test file ``path`` belongs in, or ``""``.

    The longest ``test_<prefix>.py`` beside it whose name the test file's name extends: ``test_memory_xpu.py`` ->
    ``test_memory.py``, ``test_accelerator_connector_fixes.py`` -> ``test_accelerator_connector.py``,
    ``test_ddp_side_stream.py`` -> ``test_ddp.py``.
    """
    parts = Path(path).stem.split("_")
    for end in range(len(parts) - 1, 1, -1):
        candidate = Path(path).with_name("_".join(parts[:end]) + ".py")
        if (root / candidate).is_file():
            return str(candidate)
    return ""


def plan(root: Path, path: str, final: str | None = None) -> Fold:
    """Whether the test file ``path`` in ``root`` folds into its namesake, and if not, why.

    ``final`` is the file as the whole series leaves it: the decision holds for every patch of the series, so that a
    file is not folded by one patch and taken out again by a later one.
    """
    namesake = namesake_of(path, root)
    if not namesake:
        return Fold(path, namesake, "no upstream namesake")
    text = final if final is not None else (root / path).read_text(encoding="utf-8")
    names = _top_names(ast.parse(text))
    if "autouse=True" in text or "pytestmark" in names:
        return Fold(path, namesake, "module-wide fixtures or marks would apply to the namesake's tests")
    clash = sorted(names & _top_names(ast.parse((root / namesake).read_text(encoding="utf-8"))))
    if clash:
        return Fold(path, namesake, f"defines {', '.join(clash)} like the namesake")
    return Fold(path, namesake)


def _split(text: str) -> tuple[list[str], str]:
    """The import statements at the top of a module (after its docstring) and the rest of its source."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    imports: list[str] = []
    rest_start = len(lines)
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0]:
            continue  # the module docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append("".join(lines[node.lineno - 1: node.end_lineno]))
            continue
        rest_start = node.lineno - 1
        # comments and decorators directly above the first statement belong to it
        if getattr(node, "decorator_list", None):
            rest_start = node.decorator_list[0].lineno - 1
        while rest_start > 0 and lines[rest_start - 1].lstrip().startswith("#"):
            rest_start -= 1
        break
    return imports, "".join(lines[rest_start:])


def _bound(node: ast.Import | ast.ImportFrom) -> list[tuple[ast.alias, str]]:
    """Each alias of an import statement with the name it binds."""
    return [(alias, alias.asname or alias.name.split(".")[0]) for alias in node.names]


def _new_imports(namesake: ast.Module, imports: list[str]) -> list[str]:
    """The test file's import statements, less the names the namesake already binds (from wherever it imports them)."""
    bound = {name for node in namesake.body if isinstance(node, (ast.Import, ast.ImportFrom))
             for _, name in _bound(node)}
    out = []
    for text in imports:
        node = ast.parse(text).body[0]
        assert isinstance(node, (ast.Import, ast.ImportFrom))
        keep = [alias for alias, name in _bound(node) if name not in bound]
        if len(keep) == len(node.names):
            out.append(text if text.endswith("\n") else text + "\n")
        elif keep:
            node.names = keep
            out.append(ast.unparse(node) + "\n")
    return out


def fold_text(namesake: str, test_file: str) -> str:
    """The namesake's source with the test file's imports merged in and its body appended (not yet formatted)."""
    imports, body = _split(test_file)
    tree = ast.parse(namesake)
    last_import = max((n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))), default=0)
    lines = namesake.splitlines(keepends=True)
    new_imports = _new_imports(tree, imports)
    merged = [*lines[:last_import], *new_imports, *lines[last_import:]]
    return "".join(merged).rstrip("\n") + "\n\n\n" + body.lstrip("\n")


def _ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(exe).is_file() and not shutil.which(exe):
        raise ToolError("folding tests needs ruff (pip install ruff==0.14.10, as upstream's pre-commit)")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)


def tidy(paths: list[Path]) -> None:
    """Sort imports and format ``paths`` with upstream's ruff rules."""
    if not paths:
        return
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-fold-") as tmp:
        config = Path(tmp) / "ruff.toml"
        shutil.copy2(RUFF_CONFIG, config)
        files = [str(p) for p in paths]
        _ruff("check", "--no-cache", "--config", str(config), "--select", "I", "--fix", "-q", *files, cwd=Path(tmp))
        proc = _ruff("format", "--no-cache", "--config", str(config), "-q", *files, cwd=Path(tmp))
        if proc.returncode != 0:
            raise ToolError(f"ruff format failed while folding tests: {proc.stderr.strip()}")


def fold_tree(root: Path, candidates: list[str], final: dict[str, str] | None = None) -> list[Fold]:
    """Fold every candidate test file present in ``root`` that can be folded; return what was decided for each.

    ``final``: the candidates' text as the whole series leaves them (see ``plan``)."""
    final = final or {}
    decisions = [plan(root, path, final.get(path)) for path in candidates if (root / path).is_file()]
    touched = []
    for fold in decisions:
        if fold.folds:
            target = root / fold.namesake
            target.write_text(fold_text(target.read_text(encoding="utf-8"), (root / fold.path).read_text(
                encoding="utf-8")), encoding="utf-8")
            (root / fold.path).unlink()
            touched.append(target)
    tidy(touched)
    return decisions


def unfold_text(namesake: str, test_file: str) -> str | None:
    """The namesake without the body that ``fold_text`` appended from ``test_file``; None if it is not there as is."""
    body = _split(test_file)[1].strip("\n")
    if namesake.count(body) != 1:
        return None
    return namesake.replace(body, "").rstrip("\n") + "\n"


def is_candidate(path: str) -> bool:
    """Whether ``path`` names a test file that may belong in a namesake (``tests/**/test_<a>_<b>.py``)."""
    return path.startswith("tests/") and path.endswith(".py") and Path(path).stem.startswith("test_") and Path(
        path).stem.count("_") >= 2
