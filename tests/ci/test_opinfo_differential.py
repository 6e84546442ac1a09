"""The OpInfo differential lists exactly the cases where one device ran an operator and the other refused it."""

import json

from ci.opinfo_differential import compare, main


def test_compare_lists_only_accept_refuse_disagreements():
    cuda = {
        "add": {"0:as-is": "ok", "0:cpu-operand": "RuntimeError", "0:non-contiguous": "ok"},
        "mul": {"0:cpu-operand": "RuntimeError"},
        "only_cuda": {"0:as-is": "ok"},
    }
    xpu = {
        "add": {"0:as-is": "ok", "0:cpu-operand": "ok", "0:non-contiguous": "ok"},
        "mul": {"0:cpu-operand": "TypeError"},  # both refuse: the exception type may differ
        "only_xpu": {"0:as-is": "RuntimeError"},
    }
    assert compare(cuda, xpu) == [("add", "0:cpu-operand", "RuntimeError", "ok")]


def test_report_counts_and_groups_by_form(tmp_path):
    def write(name, device, outcomes):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"meta": {"device": device, "torch": "2.x", "name": name}, "outcomes": outcomes}))
        return path

    cuda = write("H200", "cuda", {"add": {"0:as-is": "ok", "1:non-contiguous": "ok"}})
    xpu = write("emulated", "xpu", {"add": {"0:as-is": "ok", "1:non-contiguous": "RuntimeError"}})
    report = tmp_path / "report.md"
    assert main(["compare", str(cuda), str(xpu), "--report", str(report)]) == 0
    text = report.read_text()
    assert "2 cases of 1 operators compared; 1 where one device ran the operator and the other raised" in text
    assert "## `non-contiguous`: 1" in text
    assert "| `add` | 1 | ok | RuntimeError |" in text
    assert "## `as-is`: 0" in text
