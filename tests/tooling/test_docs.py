"""The README and docs/: every relative link resolves (in every Markdown file of the repository), and the counts they
quote are their sources' counts.

A count that states what the series is now ("34 patches", "2.6.6+xpu.34") must match ``patches/series``; a record of
a run names the series it ran on as "the N-patch series" and is left as it was measured.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ci import cuda_matrix
from lightning_xpu.series import load_series
from lightning_xpu.upstream import load_upstream_base

from .conftest import PATCHES, REPO

MASTER = PATCHES / "master"
COVER = MASTER / "COVER.md"
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), COVER])


def markdown_files(root: Path) -> list[Path]:
    """Every Markdown file under ``root``, outside hidden and build directories (.git, .tox, .venv, build, dist)."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d not in ("build", "dist", "__pycache__"))
        found += [Path(directory) / name for name in files if name.endswith(".md")]
    return sorted(found)


_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def _prose(text: str) -> str:
    """The text outside code blocks and code spans, where links live."""
    return _CODE.sub("", _FENCE.sub("", text))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (not ``-`` or ``_``), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        anchor = github_anchor(heading)
        out.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file, or whose heading in a Markdown file, does not exist."""
    broken = []
    for target in _LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or not resolved.is_relative_to(REPO):
            broken.append(f"{page.relative_to(REPO)}: {target} does not exist")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{page.relative_to(REPO)}: {target} has no heading #{fragment}")
    return broken


def test_the_readme_is_a_short_front_door() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:40])
    assert "--index-url https://download.pytorch.org/whl/xpu" in first and 'accelerator="xpu"' in first


@pytest.mark.parametrize("name", ["using", "reviewing", "editing-the-series", "testing", "emulator"])
def test_every_audience_has_a_page_linked_from_the_readme(name: str) -> None:
    assert (REPO / "docs" / f"{name}.md").is_file()
    assert f"](docs/{name}.md)" in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", markdown_files(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_every_markdown_file_is_link_checked() -> None:
    found = {p.relative_to(REPO).as_posix() for p in markdown_files(REPO)}
    assert {"README.md", "ci/README.md", "ci/intel/README.md", "lightning_xpu/emulator/README.md",
            "benchmarks/results/replay-upstream.md", "patches/master/COVER.md", "docs/using.md"} <= found
    assert not [name for name in found if name.startswith((".tox/", ".venv/", ".git/"))]


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading, here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-code-heading-here) [gone](missing.md) [bad](other.md#nowhere) `[not](a link)`\n"
                    "```\n[neither](inside a fence)\n```\n[web](https://example.invalid/x)\n")
    assert broken_links(page) == ["page.md: missing.md does not exist",
                                  "page.md: other.md#nowhere has no heading #nowhere"]


def _quoted(pattern: str, *, prose: bool = True) -> list[tuple[str, int]]:
    """(page, number) for each match of ``pattern``, in the prose only (not `git am -3 patches/...`) unless told."""
    texts = {page.name: page.read_text(encoding="utf-8") for page in PAGES}
    return [(name, int(n)) for name, text in texts.items()
            for n in re.findall(pattern, _prose(text) if prose else text)]


def test_the_patch_counts_quoted_are_the_series_count() -> None:
    count = load_series(PATCHES).version
    assert load_series(MASTER).version == count  # the docs call them the same patches
    quoted = _quoted(r"\b(\d+) patches\b") + _quoted(r"\+xpu\.(\d+)\b", prose=False)
    assert quoted, "the README names the number of patches"
    assert [(page, n) for page, n in quoted if n != count] == []


def test_the_master_base_commit_quoted_is_base_toml_s() -> None:
    commit = load_upstream_base(MASTER).commit
    quoted = [sha for page in PAGES for sha in re.findall(r"master`? at `?([0-9a-f]{7,40})\b", page.read_text())]
    assert quoted and all(commit.startswith(sha) for sha in quoted), quoted
    assert commit in (REPO / "docs" / "reviewing.md").read_text(encoding="utf-8")


def test_the_matrix_counts_quoted_are_the_maps() -> None:
    rows = cuda_matrix.read_map()
    table = cuda_matrix.counts_table(rows)
    assert table in (REPO / "docs" / "testing.md").read_text(encoding="utf-8"), (
        "update docs/testing.md: python ci/cuda_matrix.py --table")
    assert {n for _, n in _quoted(r"\b(\d+) upstream CUDA tests\b")} == {len(rows)}
    assert {n for _, n in _quoted(r"\b(\d+) with XPU twins\b")} == {sum(1 for r in rows if r.twins)}


def test_the_cover_letter_lists_every_patch_of_the_master_variant_once_in_order() -> None:
    subjects = [patch.subject for patch in load_series(MASTER).patches]
    text = COVER.read_text(encoding="utf-8")
    sections = re.split(r"^## PR (\d+): .*\(patch(?:es)? (\d+)(?:-(\d+))?\)$", text, flags=re.M)
    listed, ranges = [], []
    for number, first, last, body in zip(sections[1::4], sections[2::4], sections[3::4], sections[4::4], strict=True):
        rows = [(int(n), s) for n, s in re.findall(r"^\| (\d+) \| `([^`]+)` \|", body, flags=re.M)]
        ranges.append((int(number), int(first), int(last or first)))
        assert [n for n, _ in rows] == list(range(int(first), int(last or first) + 1)), f"PR {number}"
        listed += rows
    assert [number for number, _, _ in ranges] == list(range(1, len(ranges) + 1))
    assert listed == list(enumerate(subjects, 1))
