"""Whether the downstream tier was asked for: its tox environments set LIGHTNING_DOWNSTREAM_BUILD to what they
installed (``patched`` or ``control``). Anywhere else (a plain ``pytest tests``) its modules skip, saying so."""

from __future__ import annotations

import os

import pytest

BUILDS = ("patched", "control")
BUILD = os.environ.get("LIGHTNING_DOWNSTREAM_BUILD", "")


def skip_unless_selected() -> None:
    """Skip the calling test module unless a downstream tox environment runs it."""
    if not BUILD:
        pytest.skip(
            "the downstream tier needs anomalib and an XPU: tox -e downstream (the patched wheels) and "
            "tox -e downstream-control (PyPI's Lightning 2.6.6) run it",
            allow_module_level=True,
        )
