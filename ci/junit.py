"""Read pytest's JUnit XML into per-test outcomes, for the checks in ``ci/`` to count and compare."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class Case:
    """One test case: its id (``classname::name``), outcome and the first line of its failure message."""

    id: str
    outcome: str
    message: str = ""


def read_cases(path: Path) -> list[Case]:
    """The test cases of one JUnit XML file; a missing or empty file means pytest never got to write it."""
    if not path.is_file() or path.stat().st_size == 0:
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            element = case.find(child)
            if element is not None:
                outcome, message = name, _first_line(element)
                break
        classname, name = case.get("classname", ""), case.get("name", "")
        cases.append(Case(f"{classname}::{name}" if classname else name, outcome, message))
    return cases


def _first_line(element: ET.Element) -> str:
    """The error pytest reports (its first ``E`` line, e.g. ``fixture 'xpu_count_1' not found``), else the message."""
    for line in (element.text or "").splitlines():
        if line.startswith("E "):
            return line[2:].strip()
    lines = (element.get("message") or element.text or "").strip().splitlines()
    return lines[0] if lines else ""


def count(cases: list[Case]) -> Counter[str]:
    """Outcome -> number of cases."""
    return Counter(case.outcome for case in cases)


def summary(cases: list[Case]) -> str:
    """``12 passed, 1 failed, 3 skipped`` (outcomes with a zero count left out)."""
    counts = count(cases)
    parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts[o]]
    return ", ".join(parts) if parts else "no tests"
