"""The downstream tier: Lightning projects that ship their own XPU accelerator (anomalib), on an XPU.

``tox -e downstream`` runs it against the patched wheels, ``tox -e downstream-control`` against PyPI's Lightning 2.6.6;
each sets LIGHTNING_DOWNSTREAM_BUILD to what it installed, and :func:`lightning_build` checks the installed Lightning
is that one. Nothing is downloaded at run time: the hubs are offline and the models' backbones start untrained.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

from tests.downstream.support.selection import BUILD, BUILDS

if BUILD and BUILD not in BUILDS:
    raise pytest.UsageError(f"set LIGHTNING_DOWNSTREAM_BUILD to one of {', '.join(BUILDS)}, not {BUILD!r}")

if BUILD:
    # before anything imports huggingface_hub (through timm): these are read once, at import
    for _variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[_variable] = "1"

    import torch

    from tests.downstream.support import torchvision_ops

    # before anything imports torchvision (torchmetrics does, when Lightning is imported)
    torchvision_ops.define_missing_operators()

    if not torch.xpu.is_available():
        raise pytest.UsageError(
            "the downstream tier trains on an XPU: run it on an Intel GPU or with LIGHTNING_XPU_EMULATOR=1 "
            "(tox -e downstream / downstream-control)"
        )


@pytest.fixture(scope="session")
def lightning_build() -> str:
    """``"patched"`` (this repository's wheels) or ``"control"`` (PyPI's 2.6.6), checked against what is installed."""
    version = importlib.metadata.version("lightning")
    if BUILD == "patched":
        assert "+xpu." in version, f"the patched build is tested, but lightning {version} is installed"
    else:
        assert version == "2.6.6", f"the control is PyPI's lightning 2.6.6, but lightning {version} is installed"
    return BUILD


@pytest.fixture(scope="session")
def folder_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ``Folder`` data set: ``good/``, ``bad/`` and ``mask/``."""
    from tests.downstream.support.synthetic_data import make_folder_dataset

    return make_folder_dataset(tmp_path_factory.mktemp("folder"))
