"""The OpInfo differential lists exactly the cases where one device ran an operator and the other refused it."""

import json

from ci.opinfo_differential import by_design, compare, main


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
    # a difference without a reason fails the comparison
    assert main(["compare", str(cuda), str(xpu), "--report", str(report)]) == 1
    text = report.read_text()
    assert "2 cases of 1 operators compared" in text
    assert "1 where one device ran the operator and the other raised, **1 of them unexplained**" in text
    assert "## `non-contiguous`: 1" in text
    assert "| `add` | 1 | ok | RuntimeError | **unexplained** |" in text
    assert "## `as-is`: 0" in text


def test_differences_by_design_carry_their_reason_and_pass(tmp_path):
    def write(name, outcomes):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"meta": {"device": name, "torch": "2.x", "name": name}, "outcomes": outcomes}))
        return path

    cuda = write("cuda", {"jiterator_unary": {"0:as-is": "ok"}, "histogram": {"0:as-is": "NotImplementedError"}})
    xpu = write("xpu", {"jiterator_unary": {"0:as-is": "AssertionError"}, "histogram": {"0:as-is": "ok"}})
    report = tmp_path / "report.md"
    assert main(["compare", str(cuda), str(xpu), "--report", str(report)]) == 0
    assert "**0 of them unexplained**" in report.read_text()
    assert "CUDA only" in by_design("jiterator_binary")
    assert by_design("histogram")
    # torch-xpu-ops 2.13 has no histogramdd kernel either: the emulator refuses it as CUDA does
    assert by_design("histogramdd") is None
    # a prefix names an operator or its variants, not every operator that starts alike
    assert by_design("to_sparse_csr") is None
    assert by_design("index_select") is None
