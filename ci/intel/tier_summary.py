"""The XPU tier's summary: what its JUnit files say, labelled as a hardware run or as a rehearsal.

A rehearsal (``run_xpu_tier.py --rehearse``) runs every step of the tier on emulated XPUs. Its JUnit suites are named
``xpu-tier-REHEARSAL-emulated-<group>`` and its summary's title says REHEARSAL, so that nothing it leaves can be read as
a result from Intel GPUs: the hardware verdict (``## XPU tier: PASSED``) never comes out of a rehearsal's files, and a
hardware run that finds them among its own fails.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from ci.junit import read_cases, summary

HARDWARE_SUITE = "xpu-tier-"
REHEARSAL_SUITE = "xpu-tier-REHEARSAL-emulated-"


def suite_name(group: str, emulated_xpus: int = 0) -> str:
    """The JUnit suite name of one test group: ``xpu-tier-lightning``, or in a rehearsal the rehearsal's name."""
    return f"{REHEARSAL_SUITE if emulated_xpus else HARDWARE_SUITE}{group}"


def from_rehearsal(xml: Path) -> bool:
    """Whether a JUnit file was written by a rehearsal: one of its suites carries the rehearsal's name."""
    if not xml.is_file() or xml.stat().st_size == 0:
        return False
    return any(s.get("name", "").startswith(REHEARSAL_SUITE) for s in ET.parse(xml).getroot().iter("testsuite"))


def summarize(out: Path, emulated_xpus: int = 0, seconds: dict[str, float] | None = None,
              failed_steps: list[str] | None = None, emulator_settings: str = "") -> tuple[str, bool]:
    """A Markdown summary of every JUnit file in ``out`` and whether the run passed.

    ``emulated_xpus`` is 0 for a hardware run, else the number of emulated XPUs the rehearsal ran on (and
    ``emulator_settings`` its ``LIGHTNING_XPU_EMULATOR*`` variables); ``seconds`` is how long each step took;
    ``failed_steps`` the test steps that exited non-zero. Either kind of run fails when it finds the other kind's JUnit
    files, and when a test step failed without a failed test (a collection error, or a standalone step that collected
    nothing).
    """
    rehearsal = emulated_xpus > 0
    lines = ["| run | result |", "|---|---|"]
    executed, broken, skipped, foreign = 0, [], Counter(), []
    groups: dict[str, list] = {}
    other_ranks: dict[str, list] = {}
    for xml in sorted(out.glob("junit-*.xml")):
        # standalone tests write junit-ROOT-standalone.standalone-N.xml, their ranks >= 1 also ...standalone-N.rankR.xml
        group, *parts = xml.name.removeprefix("junit-").removesuffix(".xml").split(".")
        rank = next((part.removeprefix("rank") for part in parts if part.startswith("rank")), "0")
        cases = read_cases(xml)
        if cases and from_rehearsal(xml) != rehearsal:
            foreign.append(xml.name)
        (groups if rank == "0" else other_ranks).setdefault(group, []).extend(
            case if rank == "0" else type(case)(f"{case.id} (rank {rank})", case.outcome, case.message)
            for case in cases)
    # in the order the tier runs them: each import root's XPU tests, then its standalone ones
    for group, cases in sorted(groups.items(), key=lambda g: (g[0].removesuffix("-standalone"), g[0])):
        lines.append(f"| {group} | {summary(cases)} |")
        executed += sum(c.outcome in ("passed", "failed", "error") for c in cases)
        skipped.update(c.message for c in cases if c.outcome == "skipped")
    for group, cases in [*groups.items(), *other_ranks.items()]:  # a test fails when it fails on any rank
        broken += [f"{group}: {c.id}: {c.message}" for c in cases if c.outcome in ("failed", "error")]
    failed_steps = failed_steps or []
    ok = executed > 0 and not broken and not foreign and not failed_steps
    if foreign:
        other = "a hardware run" if rehearsal else "a rehearsal on emulated XPUs"
        verdict = f"FAILED: JUnit files from {other} are among these results ({', '.join(foreign)})"
    elif executed == 0:
        verdict = "FAILED: no XPU test executed (everything skipped or nothing collected)"
    elif broken:
        verdict = f"FAILED: {len(broken)} test(s) failed"
    elif failed_steps:
        verdict = f"FAILED: {'; '.join(failed_steps)}, and no test failed: see that step's output"
    else:
        verdict = "passed" if rehearsal else "PASSED"  # the hardware verdict's word never appears in a rehearsal's
    if rehearsal:
        title = f"## XPU tier REHEARSAL on {emulated_xpus} emulated XPUs, not a hardware run: rehearsal {verdict}"
        settings = emulator_settings or f"LIGHTNING_XPU_EMULATOR={emulated_xpus}"
        intro = [f"Every step of the tier ran with `{settings}` on a CPU build of torch. "
                 "This checks the tier itself; it says nothing about Intel GPUs, their driver, Level Zero or oneCCL.",
                 "", f"{executed} XPU test(s) executed on emulated XPUs."]
    else:
        title, intro = f"## XPU tier: {verdict}", [f"{executed} XPU test(s) executed."]
    lines = [title, "", *intro, "", *lines]
    if broken:
        lines += ["", "### Failed", *(f"- `{b}`" for b in broken)]
    if skipped:
        lines += ["", "### Skipped, by reason", *(f"- {n} x {reason}" for reason, n in skipped.most_common())]
    if seconds:
        lines += ["", "### Steps", "", "| step | seconds |", "|---|---|",
                  *(f"| {name} | {s:.0f} |" for name, s in seconds.items())]
    return "\n".join(lines) + "\n", ok
