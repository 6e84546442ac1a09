"""The XPU tier's rehearsal on emulated XPUs says so everywhere, and can never be read as a hardware run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ci.intel import check_xpu, run_xpu_tier
from ci.intel.tier_summary import from_rehearsal, suite_name, summarize
from lightning_xpu.series import load_series

ROOT = Path(__file__).resolve().parents[2]
HARDWARE_PASS = "## XPU tier: PASSED"


def _junit(path: Path, suite: str, *cases: str) -> None:
    body = "".join(f'<testcase classname="tests_fabric.test_xpu" name="test_{i}">{inner}</testcase>'
                   for i, inner in enumerate(cases))
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="{suite}">{body}</testsuite></testsuites>')


class FakeProcesses:
    """Stands in for the tier's subprocesses: records each command and its environment, answers ``doctor --json``
    with this series' wheels, and writes for each test step the JUnit file pytest would, under the suite name the
    tier asked for (``--override-ini=junit_suite_name=...``; that pytest honours it is tested on real pytest below)."""


    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        version = len(load_series(ROOT / "patches").patches)
        self.doctor = json.dumps({"lightning": [
            {"root": root, "installed": True, "version": f"2.6.6+xpu.{version}", "series_version": version}
            for root in ("lightning", "pytorch_lightning", "lightning_fabric")]})

    def run(self, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``doctor --json``, the one command the tier reads rather than streams."""
        self.calls.append((cmd, kwargs["env"]))
        assert cmd[-2:] == ["doctor", "--json"]
        return subprocess.CompletedProcess(cmd, 0, stdout=self.doctor, stderr="")

    def Popen(self, cmd: list[str], **kwargs) -> "FakeProcesses.Step":  # noqa: N802 - stands in for subprocess.Popen
        self.calls.append((cmd, kwargs["env"]))
        options = dict(a.split("=", 1) for a in cmd if a.startswith("--") and "=" in a)
        if "--junitxml" in options:
            _junit(Path(options["--junitxml"]), options["--override-ini"].removeprefix("junit_suite_name="), "")
        if cmd[-1] != "doctor":
            return self.Step("ok\n")
        # the doctor's verdict: 3 (emulated) under the emulator, 0 (usable) on Intel GPUs, unless a test says otherwise
        emulated = kwargs["env"].get("LIGHTNING_XPU_EMULATOR", "0") not in ("", "0")
        verdict = self.doctor_exit if self.doctor_exit is not None else 3 if emulated else 0
        return self.Step("xpu:0 Intel(R) Data Center GPU Max 1550 (emulated)\n", verdict)

    doctor_exit: int | None = None

    class Step:
        def __init__(self, output: str, returncode: int = 0) -> None:
            self.stdout, self.returncode = iter(output.splitlines(keepends=True)), returncode

        def __enter__(self) -> "FakeProcesses.Step":
            return self

        def __exit__(self, *exc: object) -> None:
            pass


@pytest.fixture
def processes(monkeypatch) -> FakeProcesses:
    monkeypatch.delenv("LIGHTNING_XPU_EMULATOR", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    fake = FakeProcesses()
    monkeypatch.setattr(run_xpu_tier.subprocess, "run", fake.run)
    monkeypatch.setattr(run_xpu_tier.subprocess, "Popen", fake.Popen)
    return fake


def test_a_rehearsal_runs_every_step_on_emulated_xpus_and_labels_everything(tmp_path, processes, capsys):
    out = tmp_path / "results"
    assert run_xpu_tier.main(["--rehearse", "--out", str(out)]) == 0
    steps = [cmd for cmd, _ in processes.calls]
    # check, build + install, doctor, the installed-series check, tree, and four test steps: both roots, each twice
    assert [Path(c[1]).name if c[1].endswith(".py") else c[3] for c in steps] == [
        "check_xpu.py", "build", "doctor", "doctor", "workspace", "run.py", "run.py", "run.py", "run.py"]
    assert "--rehearse" in steps[0]
    assert all(env["LIGHTNING_XPU_EMULATOR"] == "4" for _, env in processes.calls)
    tests = [cmd for cmd in steps if cmd[1].endswith("run.py")]
    assert [(c[c.index("--import-root") + 1], "--standalone" in c) for c in tests] == [
        ("lightning", False), ("lightning", True), ("standalone", False), ("standalone", True)]
    assert all(c.index("-v") > c.index("--") for c in tests if "--standalone" not in c)
    assert not any("-v" in c for c in tests if "--standalone" in c)  # run.py reads node ids from quiet output
    printed = capsys.readouterr().out
    assert all(f"=== [REHEARSAL on 4 emulated XPUs] {t}" in printed for t in ("XPU check", "doctor", "XPU tests"))
    assert (out / "doctor.txt").read_text().startswith("REHEARSAL on 4 emulated XPUs (LIGHTNING_XPU_EMULATOR=4), "
                                                       "not a hardware run")
    junit = sorted(out.glob("junit-*.xml"))
    assert len(junit) == 4 and all(from_rehearsal(xml) for xml in junit)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## XPU tier REHEARSAL on 4 emulated XPUs, not a hardware run: rehearsal passed\n")
    assert "PASSED" not in summary
    assert "| XPU tests (standalone-standalone) |" in summary  # how long each step took


def test_a_rehearsal_names_the_emulator_profile_it_ran_under(tmp_path, processes, monkeypatch):
    monkeypatch.setenv("LIGHTNING_XPU_EMULATOR_TORCH", "2.8")
    assert run_xpu_tier.main(["--rehearse", "--out", str(tmp_path)]) == 0
    assert all(env["LIGHTNING_XPU_EMULATOR_TORCH"] == "2.8" for _, env in processes.calls)
    assert ("ran with `LIGHTNING_XPU_EMULATOR=4 LIGHTNING_XPU_EMULATOR_TORCH=2.8` on a CPU build of torch"
            in (tmp_path / "summary.md").read_text())


def test_without_rehearse_the_tier_is_a_hardware_run(tmp_path, processes):
    out = tmp_path / "results"
    assert run_xpu_tier.main(["--out", str(out)]) == 0  # the fake check stands in for a machine with real XPUs
    assert "--rehearse" not in processes.calls[0][0]
    assert not any("LIGHTNING_XPU_EMULATOR" in env for _, env in processes.calls)
    assert not any(from_rehearsal(xml) for xml in out.glob("junit-*.xml"))
    assert (out / "summary.md").read_text().startswith(HARDWARE_PASS + "\n")
    assert not (out / "doctor.txt").read_text().startswith("REHEARSAL")


def test_a_test_list_narrows_every_test_step(tmp_path, processes):
    listed = tmp_path / "subset.txt"
    listed.write_text("# a comment\n\ntests_fabric/test_a.py::test_x  # why\ntests_pytorch/test_b.py\n")
    assert run_xpu_tier.main(["--rehearse", "2", "--out", str(tmp_path / "o"), "--test-list", str(listed),
                              "--", "-k", "bf16"]) == 0
    tests = [cmd for cmd, _ in processes.calls if cmd[1].endswith("run.py")]
    assert len(tests) == 4
    assert all(c[-4:] == ["tests_fabric/test_a.py::test_x", "tests_pytorch/test_b.py", "-k", "bf16"] for c in tests)
    assert all(env["LIGHTNING_XPU_EMULATOR"] == "2" for _, env in processes.calls)
    listed.write_text("# nothing\n")
    assert run_xpu_tier.main(["--rehearse", "--out", str(tmp_path / "o"), "--test-list", str(listed)]) == 1


def test_the_emulator_is_refused_without_rehearse_even_when_the_check_would_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_XPU_EMULATOR", "4")
    monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 4)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: "Intel(R) Data Center GPU Max 1550")
    assert "the XPU emulator is switched on (LIGHTNING_XPU_EMULATOR=4)" in check_xpu.problem(4)
    assert "the XPU emulator is switched on" in check_xpu.preflight_problem()


def test_a_rehearsal_refuses_real_xpus_and_an_emulator_that_is_off(monkeypatch):
    monkeypatch.delenv("LIGHTNING_XPU_EMULATOR", raising=False)
    assert "a rehearsal runs on emulated XPUs: set LIGHTNING_XPU_EMULATOR=N" in check_xpu.rehearsal_problem()
    monkeypatch.setenv("LIGHTNING_XPU_EMULATOR", "2")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: "Intel(R) Data Center GPU Max 1550")
    assert "these are real: Intel(R) Data Center GPU Max 1550" in check_xpu.rehearsal_problem()
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: "Intel(R) Data Center GPU Max 1550 (emulated)")
    assert check_xpu.rehearsal_problem(2) is None
    assert check_xpu.rehearsal_problem(4) == "2 emulated XPU(s) visible but this rehearsal asks for at least 4"


def test_pytest_writes_the_rehearsal_suite_name_into_its_junit_file(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    xml = tmp_path / "junit-lightning.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                    f"--junitxml={xml}", f"--override-ini=junit_suite_name={suite_name('lightning', 4)}",
                    str(tmp_path / "test_one.py")], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    assert from_rehearsal(xml)
    text, ok = summarize(tmp_path, emulated_xpus=4)
    assert ok and text.startswith("## XPU tier REHEARSAL on 4 emulated XPUs")


def test_a_rehearsals_results_cannot_be_read_as_a_hardware_pass(tmp_path):
    _junit(tmp_path / "junit-lightning.xml", suite_name("lightning", 4), "", "")
    text, ok = summarize(tmp_path, emulated_xpus=4)
    assert ok and HARDWARE_PASS not in text and "PASSED" not in text
    assert "2 XPU test(s) executed on emulated XPUs" in text
    # the same files summarised as a hardware run: the rehearsal's results make it fail
    text, ok = summarize(tmp_path)
    assert not ok
    assert text.startswith("## XPU tier: FAILED: JUnit files from a rehearsal on emulated XPUs are among these "
                           "results (junit-lightning.xml)")
    # and hardware results inside a rehearsal's output are not taken for the rehearsal's either
    _junit(tmp_path / "junit-standalone.xml", suite_name("standalone"), "")
    text, ok = summarize(tmp_path, emulated_xpus=4)
    assert not ok and "rehearsal FAILED: JUnit files from a hardware run are among these results" in text


def test_a_test_step_that_failed_without_a_failed_test_fails_the_summary(tmp_path):
    """E.g. a standalone step that collected nothing: it writes no JUnit file and must not leave a pass behind."""
    _junit(tmp_path / "junit-lightning.xml", suite_name("lightning"), "")
    text, ok = summarize(tmp_path, failed_steps=["XPU tests (lightning-standalone) failed (exit 1)"])
    assert not ok
    assert text.startswith("## XPU tier: FAILED: XPU tests (lightning-standalone) failed (exit 1), and no test failed")


def test_help_names_every_torch_channel_and_the_rehearsal():
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "intel" / "run_xpu_tier.py"), "--help"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "install_torch.sh nightly          # or: release, floor" in proc.stdout
    assert "--rehearse [N]" in proc.stdout and "--test-list FILE" in proc.stdout


def test_each_rank_of_a_standalone_test_writes_its_own_junit_file(tmp_path):
    """Lightning's launcher reruns the pytest command for ranks >= 1; one shared --junitxml file was corrupted."""
    test = "import os\n\ndef test_one():\n    assert os.environ.get('LOCAL_RANK') != '1'\n"  # fails on rank 1 only
    (tmp_path / "test_one.py").write_text(test)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "ci" / "intel" / "plugins")}
    for rank in (None, "1"):
        rank_env = {k: v for k, v in env.items() if k != "LOCAL_RANK"} | ({"LOCAL_RANK": rank} if rank else {})
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p",
                        "xpu_tier_ranks", f"--junitxml={tmp_path / 'junit-lightning-standalone.standalone-0.xml'}",
                        str(tmp_path / "test_one.py")], cwd=tmp_path, env=rank_env, capture_output=True, timeout=120)
    assert sorted(p.name for p in tmp_path.glob("junit-*.xml")) == [
        "junit-lightning-standalone.standalone-0.rank1.xml", "junit-lightning-standalone.standalone-0.xml"]
    # rank 0's test is counted once; rank 1's failure fails the run
    text, ok = summarize(tmp_path)
    assert not ok
    assert "| lightning-standalone | 1 passed |" in text and "1 XPU test(s) executed" in text
    assert "- `lightning-standalone: test_one::test_one (rank 1): " in text


@pytest.mark.parametrize(("rehearse", "doctor_exit"), [(True, 0), (False, 3), (True, 1)])
def test_the_tier_stops_unless_the_doctor_gives_the_expected_verdict(tmp_path, processes, rehearse, doctor_exit):
    """A rehearsal needs the "emulated" verdict (3), a hardware run "usable" (0); "not usable" (1) stops either."""
    processes.doctor_exit = doctor_exit
    tier = run_xpu_tier.Tier(tmp_path / "out", emulated_xpus=4 if rehearse else 0)
    expected = rf"doctor failed \(exit {doctor_exit}, expected {3 if rehearse else 0}\)"
    with pytest.raises(run_xpu_tier.StepFailed, match=expected):
        run_xpu_tier.run(tier, 1, ["lightning"], True, [])
