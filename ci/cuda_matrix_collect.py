"""pytest plugin for ``ci/cuda_matrix.py``: write every collected test's id and tier to ``$CUDA_MATRIX_OUT`` (JSON).

Loaded with ``-p cuda_matrix_collect`` (``ci/`` on ``PYTHONPATH``) by ``tests/tooling/test_cuda_matrix.py``, which
collects the series' tests from a patched tree with ``tests/series/run.py ... -- --collect-only``.
"""

import json
import os

import pytest
from cuda_matrix import tier_of


def pytest_collection_finish(session: pytest.Session) -> None:
    tiers: dict[str, list[str]] = {}
    for item in session.items:
        markers = [dict(m.kwargs) for m in item.iter_markers(name="skipif")]
        tiers.setdefault(item.nodeid, []).append(tier_of(markers))
    with open(os.environ["CUDA_MATRIX_OUT"], "w") as out:
        json.dump(tiers, out, indent=1, sort_keys=True)
