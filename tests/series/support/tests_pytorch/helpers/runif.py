"""``RunIf`` for the series' Trainer tests, as upstream's ``tests_pytorch.helpers.runif`` provides it."""

import pytest
from lightning.pytorch.utilities.testing import _runif_reasons


def RunIf(**kwargs: object) -> pytest.MarkDecorator:  # noqa: N802 - upstream's name
    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs)
