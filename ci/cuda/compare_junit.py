"""Compare two JUnit XML reports of the same tests: print every test whose outcome differs.

    python ci/cuda/compare_junit.py BEFORE.xml AFTER.xml
"""

import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    result = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[name] = kinds[0] if kinds else "passed"
    return result


def main(before_path: str, after_path: str) -> int:
    before, after = outcomes(before_path), outcomes(after_path)
    changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    counts = {o: list(after.values()).count(o) for o in ("passed", "failure", "error", "skipped")}
    print(f"{after_path}: {len(after)} tests {counts}; {len(changed)} changed outcome(s) against {before_path}")
    for name in changed:
        print(f"  {before.get(name, 'absent')} -> {after.get(name, 'absent')}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
