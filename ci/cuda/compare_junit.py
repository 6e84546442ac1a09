"""Compare two JUnit XML reports of the same tests: print every test whose outcome differs.

    python ci/cuda/compare_junit.py BEFORE.xml AFTER.xml
    python ci/cuda/compare_junit.py --by-function BEFORE.xml AFTER.xml

``--by-function`` compares per test function how many cases passed, failed, errored and skipped, leaving out the
cases whose parameters name xpu: an upstream test that gained an ``accelerator`` parameter (``test_x`` before,
``test_x[cuda]`` and ``test_x[xpu]`` after) must keep the outcomes of its CUDA cases.
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    result = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[name] = kinds[0] if kinds else "passed"
    return result


def by_function(cases: dict[str, str]) -> dict[str, Counter]:
    result: dict[str, Counter] = {}
    for name, outcome in cases.items():
        function, _, params = name.partition("[")
        if not re.search(r"(^|\W|_)xpu", params):
            result.setdefault(function, Counter())[outcome] += 1
    return result


def compare_functions(before_path: str, after_path: str) -> int:
    before, after = by_function(outcomes(before_path)), by_function(outcomes(after_path))
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    total = sum(after.values(), Counter())
    print(f"{after_path}: {len(after)} test functions, their non-XPU cases {dict(total)}; {len(changed)} function(s) "
          f"with other outcomes than in {before_path}")
    for name in changed:
        print(f"  {dict(before.get(name, {}))} -> {dict(after.get(name, {}))}  {name}")
    return 0


def main(before_path: str, after_path: str) -> int:
    before, after = outcomes(before_path), outcomes(after_path)
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    counts = {o: list(after.values()).count(o) for o in ("passed", "failure", "error", "skipped")}
    print(f"{after_path}: {len(after)} tests {counts}; {len(changed)} changed outcome(s) against {before_path}")
    for name in changed:
        print(f"  {before.get(name, 'absent')} -> {after.get(name, 'absent')}  {name}")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--by-function":
        sys.exit(compare_functions(*sys.argv[2:4]))
    sys.exit(main(*sys.argv[1:3]))
