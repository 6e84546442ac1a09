"""The patch series: locate ``patches/``, read its quilt ``series`` file and summarise each patch.

The series version N, used in the wheel version ``2.6.6+xpu.N``, is the number of patches in the series.
It only grows as patches are added; a series whose patches were edited in place keeps its N, and
``Series.digest`` (recorded by ``apply --installed`` and shown by ``doctor``) tells such series apart.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from lightning_xpu.errors import ToolError

SERIES_FILE = "series"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


@dataclass(frozen=True)
class Hunk:
    """One hunk of a patch: the file it changes, its 1-based index within that file and its header."""

    path: str
    index: int
    old_start: int
    header: str


@dataclass(frozen=True)
class Patch:
    """One patch file of the series."""

    name: str
    path: Path
    subject: str
    files: tuple[str, ...]
    hunks: tuple[Hunk, ...]

    def find_hunk(self, path: str, old_start: int) -> Hunk | None:
        """The hunk of ``path`` starting at ``old_start`` in the original file, as git apply reports it."""
        for hunk in self.hunks:
            if hunk.path == path and hunk.old_start == old_start:
                return hunk
        return None


@dataclass(frozen=True)
class Series:
    """An ordered patch series and the directory holding it."""

    directory: Path
    patches: tuple[Patch, ...]

    @property
    def version(self) -> int:
        """N in ``2.6.6+xpu.N``: the number of patches."""
        return len(self.patches)

    @property
    def local_version(self) -> str:
        return f"xpu.{self.version}"

    @property
    def digest(self) -> str:
        """sha256 over the series order and every patch's bytes."""
        digest = hashlib.sha256()
        for patch in self.patches:
            digest.update(patch.name.encode() + b"\0" + patch.path.read_bytes() + b"\0")
        return digest.hexdigest()

    @property
    def files(self) -> tuple[str, ...]:
        """Every path any patch touches, in first-seen order."""
        seen: dict[str, None] = {}
        for patch in self.patches:
            seen.update(dict.fromkeys(patch.files))
        return tuple(seen)


def default_series_dir() -> Path:
    """The checkout's ``patches/`` when running from a checkout, else the copy shipped in the package."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / "patches"
    if (checkout / SERIES_FILE).is_file():
        return checkout
    shipped = package / "_series"
    if (shipped / SERIES_FILE).is_file():
        return shipped
    raise ToolError("no patch series found next to the lightning_xpu package; pass --series DIR")


def find_series_dir(override: Path | None = None) -> Path:
    if override is None:
        return default_series_dir()
    if not (override / SERIES_FILE).is_file():
        raise ToolError(f"{override} is not a series directory: it has no {SERIES_FILE} file")
    return override


def read_series_names(directory: Path) -> list[str]:
    """Patch names from a quilt series file (comments, blank lines and a ``-p1`` option allowed)."""
    names = []
    for lineno, raw in enumerate((directory / SERIES_FILE).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *opts = line.split()
        if opts not in ([], ["-p1"]):
            raise ToolError(f"{directory / SERIES_FILE}:{lineno}: only the -p1 option is supported, got {opts}")
        if "/" in name or name in names:
            raise ToolError(f"{directory / SERIES_FILE}:{lineno}: invalid or repeated patch name {name!r}")
        names.append(name)
    return names


def parse_patch(path: Path) -> Patch:
    """Read subject, touched files and hunks of a ``git format-patch`` file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"the series lists {path.name} but {path} does not exist") from None
    except UnicodeDecodeError:
        raise ToolError(f"patch {path.name} is not valid UTF-8 text") from None
    lines = text.splitlines()
    subject = _subject(lines) or path.stem
    files: list[str] = []
    hunks: list[Hunk] = []
    current: str | None = None
    count = 0
    for line in lines:
        if m := _DIFF.match(line):
            current = m.group(2)
            count = 0
            if current not in files:
                files.append(current)
        elif current is not None and (m := _HUNK.match(line)):
            count += 1
            hunks.append(Hunk(current, count, int(m.group(1)), line))
    if not files:
        raise ToolError(f"patch {path.name} contains no `diff --git` section; it is corrupt or not a git patch")
    return Patch(path.name, path, subject, tuple(files), tuple(hunks))


def _subject(lines: list[str]) -> str:
    for i, line in enumerate(lines):
        if line.startswith("Subject:"):
            parts = [line[len("Subject:"):].strip()]
            for cont in lines[i + 1:]:
                if not cont.startswith((" ", "\t")):
                    break
                parts.append(cont.strip())
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(parts))
        if not line:  # end of the mail headers
            break
    return ""


def load_series(directory: Path) -> Series:
    """Load and parse the series in ``directory``."""
    directory = Path(directory).resolve()  # patches are applied from other working directories
    return Series(directory, tuple(parse_patch(directory / name) for name in read_series_names(directory)))
