"""Patch the Lightning installed in an environment in place (``apply --installed``) and revert it.

The installed ``lightning``, ``pytorch_lightning`` and ``lightning_fabric`` packages must be exactly the pristine
2.6.6 base (every file compared by sha256 with the unpacked sdists). The series is applied to patched trees
built the same way as the wheels; changed, added and removed files are then written in place, after the
originals were copied to ``<site-packages>/.lightning-xpu-backup/`` together with a ``manifest.json``.
``--revert`` restores those originals byte for byte and deletes the added files and the backup.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.base import LIGHTNING, LIGHTNING_FABRIC, PYTORCH_LIGHTNING, Base, base_trees, sha256_of
from lightning_xpu.errors import ToolError
from lightning_xpu.mirror import relative_files
from lightning_xpu.series import Series
from lightning_xpu.wheels import prepare_trees

BACKUP_DIR = ".lightning-xpu-backup"
MANIFEST = "manifest.json"
# Import root -> (distribution whose sdist holds its pristine source, directory under that sdist's src/).
ROOTS = {
    "lightning": (LIGHTNING, "lightning"),
    "pytorch_lightning": (PYTORCH_LIGHTNING, "pytorch_lightning"),
    "lightning_fabric": (LIGHTNING_FABRIC, "lightning_fabric"),
}


@dataclass(frozen=True)
class InstalledResult:
    site_packages: Path
    roots: tuple[str, ...]
    changed: int
    added: int
    removed: int
    version: str


def find_roots(search_path: list[str] | None = None) -> dict[str, Path]:
    """Directories of the installed import roots, found without importing them."""
    roots = {}
    for name in ROOTS:
        if search_path is None:
            spec = importlib.util.find_spec(name)
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, search_path)
        if spec is not None and spec.submodule_search_locations:
            roots[name] = Path(next(iter(spec.submodule_search_locations))).resolve()
    return roots


def _site_packages(roots: dict[str, Path]) -> Path:
    if not roots:
        raise ToolError("no lightning, pytorch_lightning or lightning_fabric is installed in this environment")
    parents = {path.parent for path in roots.values()}
    if len(parents) != 1:
        raise ToolError(f"the Lightning packages are installed in different directories ({sorted(map(str, parents))})")
    return parents.pop()


def _files(root: Path) -> set[str]:
    return {rel for rel in relative_files(root) if not rel.endswith(".pyc")}


def check_pristine(name: str, installed: Path, pristine: Path) -> None:
    """Raise unless ``installed`` holds exactly the pristine files (every installed file equal, no .py missing)."""
    have, want = _files(installed), _files(pristine)
    extra = sorted(have - want)
    missing = sorted(rel for rel in want - have if rel.endswith(".py"))
    if extra or missing:
        example = extra[0] if extra else missing[0]
        raise ToolError(
            f"the installed {name} at {installed} is not the pristine base: {example} is "
            f"{'not in' if extra else 'missing from'} the 2.6.6 sdist; reinstall lightning==2.6.6 first"
        )
    for rel in sorted(have):
        if sha256_of(installed / rel) != sha256_of(pristine / rel):
            raise ToolError(
                f"the installed {name} at {installed} is not the pristine base: {rel} differs from the 2.6.6 sdist; "
                "reinstall lightning==2.6.6 (or run `lightning-xpu apply --installed --revert` if it was patched)"
            )


def apply_installed(series: Series, base: Base, *, check: bool = False, search_path: list[str] | None = None,
                    cache: Path | None = None) -> InstalledResult:
    """Patch the installed Lightning in place (or, with ``check``, only verify that it could be)."""
    roots = find_roots(search_path)
    site = _site_packages(roots)
    backup = site / BACKUP_DIR
    if (backup / MANIFEST).is_file():
        info = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
        raise ToolError(f"the installed Lightning in {site} is already patched (series version "
                        f"{info.get('series_version')}); run `lightning-xpu apply --installed --revert` first")
    pristine_sdists = base_trees(base, cache)
    for name, path in roots.items():
        dist, pkg = ROOTS[name]
        check_pristine(name, path, pristine_sdists[dist] / "src" / pkg)
    with tempfile.TemporaryDirectory(prefix="lightning-xpu-installed-") as tmp:
        prepared = prepare_trees(series, base, Path(tmp), cache)
        plan: list[tuple[str, str, str]] = []  # (root, relative path, action)
        for name, path in roots.items():
            dist, pkg = ROOTS[name]
            patched = prepared.trees[dist] / "src" / pkg
            before, after = _files(path), _files(patched)
            for rel in sorted(after):
                if rel not in before:
                    plan.append((name, rel, "added"))
                elif sha256_of(path / rel) != sha256_of(patched / rel):
                    plan.append((name, rel, "changed"))
            plan += [(name, rel, "removed") for rel in sorted(before - after) if rel.endswith(".py")]
        counts = {action: sum(1 for *_, a in plan if a == action) for action in ("changed", "added", "removed")}
        result = InstalledResult(site, tuple(roots), counts["changed"], counts["added"], counts["removed"],
                                 prepared.version)
        if check:
            return result
        _write_in_place(site, roots, plan, prepared, series, backup)
    return result


def _write_in_place(site: Path, roots: dict[str, Path], plan: list[tuple[str, str, str]],
                    prepared, series: Series, backup: Path) -> None:  # noqa: ANN001
    staging = Path(tempfile.mkdtemp(dir=site, prefix=f"{BACKUP_DIR}.tmp-"))
    entries = []
    for name, rel, action in plan:
        current = roots[name] / rel
        entry = {"root": name, "path": rel, "action": action}
        if action != "added":
            saved = staging / name / rel
            saved.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(current, saved)
            entry["original_sha256"] = sha256_of(current)
        if action != "removed":
            dist, pkg = ROOTS[name]
            entry["patched_sha256"] = sha256_of(prepared.trees[dist] / "src" / pkg / rel)
        entries.append(entry)
    manifest = {"series_version": series.version, "series_digest": series.digest, "version": prepared.version,
                "roots": {name: str(path) for name, path in roots.items()}, "files": entries}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    staging.rename(backup)  # the backup is complete before anything in site-packages changes
    try:
        for entry in entries:
            target = roots[entry["root"]] / entry["path"]
            dist, pkg = ROOTS[entry["root"]]
            if entry["action"] == "removed":
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(prepared.trees[dist] / "src" / pkg / entry["path"], target)
    except OSError as err:
        revert_installed(search_path=None, site=site, force=True)
        raise ToolError(f"patching {site} failed ({err}); the original files were restored") from None


def revert_installed(*, search_path: list[str] | None = None, site: Path | None = None,
                     force: bool = False) -> InstalledResult:
    """Restore the originals saved by ``apply_installed`` and delete the files it added and its backup."""
    if site is None:
        site = _site_packages(find_roots(search_path))
    backup = site / BACKUP_DIR
    if not (backup / MANIFEST).is_file():
        raise ToolError(f"the installed Lightning in {site} was not patched by `apply --installed`; nothing to revert")
    manifest = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
    roots = {name: Path(path) for name, path in manifest["roots"].items()}
    if not force:
        for entry in manifest["files"]:
            target = roots[entry["root"]] / entry["path"]
            if "patched_sha256" in entry and (not target.is_file() or sha256_of(target) != entry["patched_sha256"]):
                raise ToolError(f"{target} changed after it was patched; restore it or reinstall lightning==2.6.6")
    counts = {"changed": 0, "added": 0, "removed": 0}
    for entry in manifest["files"]:
        target = roots[entry["root"]] / entry["path"]
        counts[entry["action"]] += 1
        if entry["action"] == "added":
            target.unlink(missing_ok=True)
            parent = target.parent
            while parent != roots[entry["root"]] and parent.is_dir() and not [
                    p for p in parent.iterdir() if p.name != "__pycache__"]:
                shutil.rmtree(parent)
                parent = parent.parent
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(backup / entry["root"] / entry["path"], target)
    shutil.rmtree(backup)
    return InstalledResult(site, tuple(roots), counts["changed"], counts["added"], counts["removed"],
                           manifest["version"])
