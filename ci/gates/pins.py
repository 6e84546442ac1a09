"""Upstream's pinned versions for the gates: from the base's own files where it has them, else ci/upstream_pins.toml.

An upstream commit (the master variant's base) has ``.pre-commit-config.yaml`` and ``requirements/typing.txt``; the
2.6.6 sdists (the release series' base) have neither, and the pin file records the same versions. With both at hand
the pin file is compared with the base's files, so that it cannot silently fall behind.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from lightning_xpu.errors import ToolError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PIN_FILE = Path(__file__).resolve().parents[1] / "upstream_pins.toml"
PRE_COMMIT = ".pre-commit-config.yaml"
TYPING = "requirements/typing.txt"
# the pre-commit hooks for Python that the gates run, by the repository that provides them
HOOK_REPOS = {"ruff": "ruff-pre-commit", "docformatter": "docformatter", "codespell": "codespell"}


@dataclass(frozen=True)
class Hook:
    """A pre-commit hook's tool at its pinned version and the extra packages its hook installs."""

    name: str
    version: str
    additional: tuple[str, ...]

    @property
    def requirements(self) -> list[str]:
        return [f"{self.name}=={self.version}", *self.additional]


@dataclass(frozen=True)
class Pins:
    hooks: dict[str, Hook]
    typing: tuple[str, ...]  # requirements/typing.txt's requirements
    torch_matrix: tuple[str, ...]
    source: str  # where the pins were read

    def typing_pin(self, name: str) -> str:
        for req in self.typing:
            if re.split(r"[=<>!~ \[;]", req, maxsplit=1)[0].lower() == name:
                return req
        raise ToolError(f"{self.source} pins no {name} for mypy")


def from_pin_file(path: Path = PIN_FILE) -> Pins:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    hooks = {name: Hook(name, str(table["version"]), tuple(table.get("additional-dependencies", ())))
             for name, table in data["pre-commit"].items()}
    return Pins(hooks, tuple(data["typing"]["requirements"]), tuple(data["tests"]["torch"]), str(path))


def from_base(tree: Path, fallback: Pins) -> Pins:
    """The pins of the base tree's own files, where it has them (the test matrix always comes from the pin file)."""
    config = tree / PRE_COMMIT
    if not config.is_file():
        return fallback
    repos = yaml.safe_load(config.read_text(encoding="utf-8")).get("repos", [])
    hooks = {}
    for name, repo_name in HOOK_REPOS.items():
        repo = next((r for r in repos if str(r.get("repo", "")).rstrip("/").endswith("/" + repo_name)), None)
        if repo is None:
            raise ToolError(f"{config} has no {repo_name} repository; the gates cannot pin {name}")
        hook = next((h for h in repo.get("hooks", []) if h.get("id") == name), {})
        hooks[name] = Hook(name, str(repo["rev"]).removeprefix("v"), tuple(hook.get("additional_dependencies", ())))
    typing_file = tree / TYPING
    typing = tuple(line.split("#", 1)[0].strip() for line in typing_file.read_text().splitlines()
                   if line.split("#", 1)[0].strip()) if typing_file.is_file() else fallback.typing
    source = f"the base's {PRE_COMMIT}" + (f" and {TYPING}" if typing_file.is_file() else "")
    return Pins(hooks, typing, fallback.torch_matrix, source)


def stale_entries(base: Pins, recorded: Pins) -> list[str]:
    """Where the pin file differs from the base's own pins (empty when it matches)."""
    diffs = [f"{name}: the base pins {hook.requirements}, {PIN_FILE.name} {recorded.hooks[name].requirements}"
             for name, hook in base.hooks.items() if recorded.hooks.get(name) != hook]
    if sorted(base.typing) != sorted(recorded.typing):
        diffs.append(f"typing: the base's {TYPING} has {sorted(set(base.typing) - set(recorded.typing))} that "
                     f"{PIN_FILE.name} lacks and {sorted(set(recorded.typing) - set(base.typing))} it does not have")
    return diffs
