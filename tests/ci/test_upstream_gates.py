"""The upstream gates (ci/upstream_gates.py): COVER.md's pull requests, the Needs lines, the hooks against the base,
mypy's and the tests' comparisons, the pins."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.gates import hooks, pins, torch_tests, typecheck
from ci.gates.cover import parse_cover
from ci.gates.venvs import TORCH_CPU_INDEX
from ci.junit import Case
from lightning_xpu.errors import ToolError
from tests.ci.series_factory import FAKE_BASE, commit, init_repo, make_series, write

GATES = Path(__file__).resolve().parents[2] / "ci" / "upstream_gates.py"
TOOLS = ("ruff", "docformatter", "codespell")


def _cover(tmp_path: Path, *sections: str) -> Path:
    path = tmp_path / "COVER.md"
    path.write_text("# Cover letter\n\n## The series as a whole\n\nText.\n\n" + "\n".join(sections))
    return path


def _section(number: int, span: str, needs: str) -> str:
    return f"## PR {number}: title {number} ({span})\n\n**Title:** T\n\n**Needs:** {needs}\n\nBody.\n"


def test_cover_pull_requests_and_needs(tmp_path):
    cover = _cover(tmp_path, _section(1, "patches 1-2", "nothing. Each patch can land alone."),
                   _section(2, "patches 3-3", "PR 1 (its fixes),\nwhich it builds on."),
                   _section(3, "patches 4-5", "PR 2; PR 1's barriers."), _section(4, "patches 6-6", "PRs 1-3."))
    prs = parse_cover(cover, 6)
    assert [(p.number, p.first, p.last, p.needs) for p in prs] == [
        (1, 1, 2, ()), (2, 3, 3, (1,)), (3, 4, 5, (1, 2)), (4, 6, 6, (1, 2, 3))]
    assert prs[1].needs_text == "PR 1 (its fixes), which it builds on."


@pytest.mark.parametrize(("sections", "patches", "error"), [
    ([_section(1, "patches 1-2", "nothing"), _section(2, "patch 3", "PR 1")], 3, "is not of the form"),
    ([_section(1, "patches 1-2", "nothing"), "## PR 2 - title (patches 3-3)\n\n**Needs:** PR 1\n"], 3,
     "is not of the form"),
    ([_section(1, "patches 1-2", "nothing"), _section(2, "patches 4-4", "PR 1")], 4, "patches 3-3 belong to no pull"),
    ([_section(1, "patches 1-2", "nothing"), _section(2, "patches 2-3", "PR 1")], 3, "overlaps"),
    ([_section(1, "patches 1-2", "nothing"), _section(2, "patches 3-3", "PR 1")], 4, "but the series has 4"),
    ([_section(1, "patches 1-2", "PR 2"), _section(2, "patches 3-3", "PR 1")], 3, "cannot need PR(s) [2]"),
    ([_section(1, "patches 1-2", "the fixes"), _section(2, "patches 3-3", "PR 1")], 3, "names no pull request"),
    ([_section(1, "patches 1-2", "nothing"), "## PR 2: t (patches 3-3)\n\nNo needs line.\n"], 3, "has no `**Needs:**"),
    ([_section(2, "patches 1-3", "nothing")], 3, "numbered [2]"),
])
def test_cover_refuses_what_is_not_a_clean_partition(tmp_path, sections, patches, error):
    with pytest.raises(ToolError, match=re.escape(error)):
        parse_cover(_cover(tmp_path, *sections), patches)


def test_cover_one_patch_pull_request_names_its_range(tmp_path):
    cover = _cover(tmp_path, _section(1, "patches 1-2", "nothing"), _section(2, "patch 3", "nothing"))
    with pytest.raises(ToolError, match=r"is not of the form `## PR N: title \(patches a-b\)`"):
        parse_cover(cover, 3)


def _fake_series(tmp_path: Path) -> tuple[Path, Path]:
    """A base with upstream's kind of pyproject.toml and a finding of its own, and three patches as two PRs: PR 2's
    patch changes what PR 1's adds (so it needs PR 1), adds an unused import and a misspelling."""
    pyproject = ('[tool.ruff]\nline-length = 120\n[tool.ruff.lint]\nselect = ["E", "F"]\n'
                 "[tool.docformatter]\nwrap-summaries = 119\nwrap-descriptions = 120\nblank = true\n"
                 '[tool.codespell]\nquiet-level = 3\nignore-words-list = "te"\n')
    base = {**FAKE_BASE, "pyproject.toml": pyproject, "src/lightning/fabric/old.py": "import sys\n"}
    repo = tmp_path / "ws"
    init_repo(repo, base)
    commit(repo, "fabric: add helpers", {"src/lightning/fabric/helpers.py": '"""Helpers."""\n\n\ndef f(x):\n'
                                         '    return x\n'})
    commit(repo, "fabric: old gets a line", {"src/lightning/fabric/old.py": "import sys\n\nY = 1\n"})
    commit(repo, "fabric: g", {"src/lightning/fabric/helpers.py": '"""Helpers."""\nimport os\n\n\ndef f(x):\n'
                               '    """Return x.\n    teh value."""\n    return x\n'})
    series = make_series(repo, "HEAD~3", tmp_path / "patches")
    tree = tmp_path / "base"
    write(tree, base)
    return series, tree


def _run_gates(series: Path, tree: Path, cover: Path, steps: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GATES), "--series", str(series), "--base-tree", str(tree), "--cover",
                           str(cover), "--steps", steps, "--tools-from-path"], capture_output=True, text=True)


def test_needs_names_the_pull_request_and_the_patch_that_does_not_apply(tmp_path):
    series, tree = _fake_series(tmp_path)
    cover = _cover(tmp_path, _section(1, "patches 1-2", "nothing"), _section(2, "patches 3-3", "nothing"))
    proc = _run_gates(series, tree, cover, "cover,needs")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NEEDS: PR 2 does not apply onto the bare base" in proc.stdout
    assert "patch 0003-fabric-g.patch does not apply" in proc.stdout
    fixed = _cover(tmp_path, _section(1, "patches 1-2", "nothing"), _section(2, "patches 3-3", "PR 1"))
    proc = _run_gates(series, tree, fixed, "cover,needs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every pull request applies onto exactly what its Needs line names" in proc.stdout


def test_needs_merges_first_entries_of_the_sdists_placeholder_changelog_sections(tmp_path):
    """Two pull requests that need nothing each add the first entry of a section whose only line is the sdist's `-`
    placeholder: the second applies onto the bare sdist with its entry merged, but not with another hunk off."""
    changelog = "# Changelog\n\n## [unreleased] - YYYY-MM-DD\n\n### Added\n\n-\n\n### Fixed\n\n-\n\n---\n"
    path = "src/lightning/fabric/CHANGELOG.md"
    repo = tmp_path / "ws"
    init_repo(repo, {**FAKE_BASE, path: changelog})
    commit(repo, "fabric: a", {"src/lightning/fabric/a.py": "A = 1\n", path: changelog.replace("-\n\n### Fixed",
                                                                                           "- Added a\n\n### Fixed")})
    commit(repo, "fabric: b", {"src/lightning/fabric/b.py": "B = 1\n", path: changelog.replace(
        "-\n\n### Fixed", "- Added b\n\n- Added a\n\n### Fixed")})
    series = make_series(repo, "HEAD~2", tmp_path / "patches")
    tree = tmp_path / "base"
    write(tree, {**FAKE_BASE, path: changelog})
    cover = _cover(tmp_path, _section(1, "patches 1-1", "nothing"), _section(2, "patches 2-2", "nothing"))
    proc = _run_gates(series, tree, cover, "cover,needs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the entries of PR 2 merged as upstream merges them" in proc.stdout
    (tree / "src/lightning/fabric/b.py").write_text("B = 0\n")  # PR 2's new file exists: not a CHANGELOG hunk
    proc = _run_gates(series, tree, cover, "cover,needs")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NEEDS: PR 2 does not apply onto the bare base" in proc.stdout


@pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS),
                    reason="needs ruff, docformatter and codespell on PATH; `tox -e ci` installs them")
def test_hooks_report_what_each_pull_request_adds_and_not_the_bases_own(tmp_path):
    series, tree = _fake_series(tmp_path)
    cover = _cover(tmp_path, _section(1, "patches 1-2", "nothing"), _section(2, "patches 3-3", "PR 1"))
    proc = _run_gates(series, tree, cover, "cover,hooks")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    first, second = out.split("== PR 2 end")
    assert "== PR 1 end, PR 1 (patches 1-2): title 1: 0 finding(s)" in first
    assert "old.py" not in out  # its unused import is the base's
    assert "src/lightning/fabric/helpers.py:2:8: F401 `os` imported but unused" in second
    assert "src/lightning/fabric/helpers.py:7: teh ==> the" in second
    assert "src/lightning/fabric/helpers.py: would be reformatted" in second  # no blank line after the docstring
    assert "helpers.py: docstring rewritten" in second
    assert "4 finding(s) over 2 pull request end(s)" in out


def test_new_records_ignore_line_numbers_and_count_repeats():
    base = [(("a.py", "F401", "`os` unused"), "a.py:1:1: F401 `os` unused")]
    end = [(("a.py", "F401", "`os` unused"), "a.py:5:1: F401 `os` unused"),
           (("a.py", "F401", "`os` unused"), "a.py:9:1: F401 `os` unused")]
    assert hooks.new_records(base, end) == ["a.py:9:1: F401 `os` unused"]


def test_mypy_errors_compared_by_file_and_message_not_line():
    base = typecheck.parse_errors("src/a.py:10: error: Unused \"type: ignore\" comment  [unused-ignore]\n"
                                  "src/a.py:12: note: see above\nFound 1 error in 1 file\n")
    end = typecheck.parse_errors("src/a.py:14: error: Unused \"type: ignore\" comment  [unused-ignore]\n"
                                 "src/b.py:3: error: Item \"None\" of \"Optional[Any]\" has no attribute \"x\"  "
                                 "[union-attr]\n")
    assert [str(e) for e in typecheck.new_errors(base, end)] == [
        'src/b.py:3: error: Item "None" of "Optional[Any]" has no attribute "x"  [union-attr]']


def test_mypy_errors_are_read_from_stderr_too(tmp_path):
    # with upstream's `install_types = True`, mypy prints its errors to stderr and only the summary to stdout
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'src/a.py:3: error: Boom  [misc]' >&2\necho 'Found 1 error in 1 file'\nexit 1\n")
    fake.chmod(0o755)
    errors = typecheck.run_mypy(fake, tmp_path, tmp_path / "cache")
    assert [str(e) for e in errors] == ["src/a.py:3: error: Boom  [misc]"]


def test_mypy_environment_keeps_torch_without_its_dependencies(tmp_path):
    (tmp_path / "requirements" / "pytorch").mkdir(parents=True)
    (tmp_path / "requirements" / "pytorch" / "base.txt").write_text(
        "torch >=2.1.0, <2.10.0\ntorchmetrics >0.7.0\ntqdm\n# a comment\n")
    (tmp_path / "requirements" / "pytorch" / "strategies.txt").write_text("deepspeed >=0.15.0\n")
    steps, left_out = typecheck.requirement_steps(tmp_path, ("torch==2.9.1", "mypy==1.20.0"))
    assert steps == [["mypy==1.20.0", "tqdm"], ["--no-deps", *TORCH_CPU_INDEX, "torch==2.9.1", "torchmetrics >0.7.0"]]
    assert left_out == ["deepspeed >=0.15.0 (builds against an importable torch)"]


def test_test_findings_against_the_unpatched_run():
    before = [Case("tests_fabric.test_a::test_kept", "passed"), Case("tests_fabric.test_a::test_lost", "passed"),
              Case("tests_fabric.test_a::test_param", "passed"), Case("tests_fabric.test_a::test_broken", "failed"),
              Case("tests_fabric.test_a::test_now_skipped", "passed")]
    after = [Case("tests_fabric.test_a::test_kept", "passed"),
             Case("tests_fabric.test_a::test_lost", "failed", "AttributeError: get_autocast_dtype"),
             Case("tests_fabric.test_a::test_param[cuda]", "passed"), Case("tests_fabric.test_a::test_param[xpu]",
                                                                           "skipped", "XPU needs torch 2.8"),
             Case("tests_fabric.test_a::test_broken", "failed"),
             Case("tests_fabric.test_a::test_now_skipped", "skipped", "requires torch >= 2.4"),
             Case("tests_fabric.test_a::test_new", "error", "fixture 'xpu_count_1' not found"),
             Case("tests_fabric.test_b::test_new_skip", "skipped", ""),
             Case("tests_pytorch.utilities.test_memory", "error", "AttributeError: torch has no OutOfMemoryError")]
    assert torch_tests.findings(before, after) == [
        "passed unpatched, failed patched: tests_fabric.test_a::test_lost: AttributeError: get_autocast_dtype",
        "passed unpatched, skipped patched: tests_fabric.test_a::test_now_skipped: requires torch >= 2.4",
        "new error: tests_fabric.test_a::test_new: fixture 'xpu_count_1' not found",
        "skipped without a reason: tests_fabric.test_b::test_new_skip",
        "collection error: tests_pytorch.utilities.test_memory: AttributeError: torch has no OutOfMemoryError",
    ]
    assert torch_tests.in_files(after, ["tests_pytorch/utilities/test_memory.py"]) == after[-1:]


PRE_COMMIT = """repos:
  - repo: https://github.com/codespell-project/codespell
    rev: v2.4.2
    hooks:
      - id: codespell
        additional_dependencies: [tomli]
  - repo: https://github.com/PyCQA/docformatter
    rev: v1.7.7
    hooks:
      - id: docformatter
        additional_dependencies: [tomli]
        args: ["--in-place"]
  - repo: https://github.com/astral-sh/ruff-pre-commit
    rev: v0.15.9
    hooks:
      - id: ruff
"""


def test_pins_from_the_base_and_the_pin_file_kept_honest(tmp_path):
    recorded = pins.from_pin_file()
    assert pins.from_base(tmp_path, recorded) is recorded  # no .pre-commit-config.yaml: the sdists
    (tmp_path / ".pre-commit-config.yaml").write_text(PRE_COMMIT)
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "typing.txt").write_text("\n".join(recorded.typing) + "\n")
    base = pins.from_base(tmp_path, recorded)
    assert pins.stale_entries(base, recorded) == []
    (tmp_path / ".pre-commit-config.yaml").write_text(PRE_COMMIT.replace("v0.15.9", "v0.16.0"))
    stale = pins.stale_entries(pins.from_base(tmp_path, recorded), recorded)
    assert stale == ["ruff: the base pins ['ruff==0.16.0'], upstream_pins.toml ['ruff==0.15.9']"]
