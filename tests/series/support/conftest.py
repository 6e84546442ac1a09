"""Test harness for the tests that the patch series adds under upstream's ``tests/tests_{fabric,pytorch}``.

Upstream Lightning runs those files with its own conftests; the released sdist that the series targets ships no tests,
so this file supplies the part of upstream's test environment the series' tests rely on: the tier filters
(``RUN_ONLY_XPU_TESTS``, ``RUN_ONLY_CUDA_TESTS``, ``PL_RUN_STANDALONE_TESTS``), the device-count fixtures and a few
isolation fixtures. It is written for this project; it is not a copy of upstream's conftest.
"""

import gc
import importlib.util
import os
from collections.abc import Iterator

import pytest
import torch.distributed

# rewritten to ``lightning_fabric`` / ``pytorch_lightning`` when the standalone distributions are tested
_FABRIC, _PYTORCH = "lightning.fabric", "lightning.pytorch"

# marker kwarg set by ``_runif_reasons`` -> environment variable that selects only such tests
_TIER_FILTERS = {
    "standalone": "PL_RUN_STANDALONE_TESTS",
    "min_cuda_gpus": "RUN_ONLY_CUDA_TESTS",
    "min_xpu_gpus": "RUN_ONLY_XPU_TESTS",
}


def pytest_collection_modifyitems(items: list[pytest.Function], config: pytest.Config) -> None:
    """Keep only the tests of the selected tier, as upstream's conftest does for CUDA and standalone tests."""
    selected = [kw for kw, env in _TIER_FILTERS.items() if os.getenv(env, "0") == "1"]
    if "standalone" in selected:
        # there is no device-free job for standalone tests: the standalone filter alone decides
        selected = ["standalone"]
    if not selected:
        return
    kept, deselected = [], []
    for item in items:
        marked = all(any(m.kwargs.get(kw) for m in item.iter_markers(name="skipif")) for kw in selected)
        (kept if marked else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Exempt what collection created (every test module, torch, Lightning) from the cyclic garbage collector.

    Those objects live for the whole session, yet every full collection walks them again: the batch-size finder's
    back-off calls ``gc.collect()`` after each out-of-memory trial, and with all the suites imported its two tests
    took a third of the mocked tier's CPU time. Objects the tests create are collected as before.
    """
    gc.freeze()


def _patch_count(monkeypatch: pytest.MonkeyPatch, module: str, name: str, value: int) -> None:
    # both namespaces: the Trainer's accelerators import the Fabric helpers by name; the Trainer's module may not
    # exist yet (an early prefix of the series, or lightning_fabric installed alone), then there is nothing to patch
    monkeypatch.setattr(f"{_FABRIC}.accelerators.{module}.{name}", lambda: value)
    if _module_exists(f"{_PYTORCH}.accelerators.{module}"):
        monkeypatch.setattr(f"{_PYTORCH}.accelerators.{module}.{name}", lambda: value)


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def mock_cuda_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    _patch_count(monkeypatch, "cuda", "num_cuda_devices", n)


def mock_xpu_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    _patch_count(monkeypatch, "xpu", "num_xpu_devices", n)


def mock_mps_count(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(f"{_FABRIC}.accelerators.mps._get_all_available_mps_gpus", lambda: list(range(n)))
    monkeypatch.setattr(f"{_FABRIC}.accelerators.mps.MPSAccelerator.is_available", lambda *_: n > 0)


@pytest.fixture
def cuda_count_0(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_cuda_count(monkeypatch, 0)


@pytest.fixture
def cuda_count_1(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_cuda_count(monkeypatch, 1)


@pytest.fixture
def cuda_count_2(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_cuda_count(monkeypatch, 2)


@pytest.fixture
def cuda_count_4(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_cuda_count(monkeypatch, 4)


@pytest.fixture
def xpu_count_0(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_xpu_count(monkeypatch, 0)


@pytest.fixture
def xpu_count_1(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_xpu_count(monkeypatch, 1)


@pytest.fixture
def xpu_count_2(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_xpu_count(monkeypatch, 2)


@pytest.fixture
def xpu_count_4(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_xpu_count(monkeypatch, 4)


@pytest.fixture
def mps_count_0(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_mps_count(monkeypatch, 0)


@pytest.fixture
def mps_count_1(monkeypatch: pytest.MonkeyPatch) -> None:
    mock_mps_count(monkeypatch, 1)


@pytest.fixture(autouse=True)
def restore_env_variables() -> Iterator[None]:
    """Undo environment changes a test (or Lightning under test) made, so tests stay independent under xdist."""
    before = os.environ.copy()
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture(autouse=True)
def teardown_process_group() -> Iterator[None]:
    """Destroy a process group a test left behind."""
    yield
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def preserve_global_rank_variable() -> Iterator[None]:
    """Restore the ``rank_zero_only.rank`` that a test (a Trainer or Fabric with a mocked rank) changed, as upstream's
    conftests do; otherwise later tests in the same worker log and warn nothing."""
    packages = (f"{_FABRIC}.utilities", f"{_PYTORCH}.utilities", "lightning_utilities.core")
    modules = [f"{package}.rank_zero" for package in packages]
    functions = [importlib.import_module(m).rank_zero_only for m in modules if _module_exists(m)]
    ranks = [getattr(fn, "rank", None) for fn in functions]
    yield
    for fn, rank in zip(functions, ranks, strict=True):
        if rank is not None:
            fn.rank = rank
