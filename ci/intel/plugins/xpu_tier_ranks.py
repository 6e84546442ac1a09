"""pytest plugin of the XPU tier's standalone steps: each rank writes its own JUnit file.

Lightning's subprocess launcher starts ranks 1..N-1 by running the same pytest command again with ``LOCAL_RANK`` set, so
every rank would write the one ``--junitxml`` file at once (a corrupt file, or one rank's result over another's).
Here a rank other than 0 writes ``NAME.rankN.xml`` beside rank 0's ``NAME.xml``; the tier's summary counts rank 0's
tests and every rank's failures.
"""

import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before the junitxml plugin opens its file
def pytest_configure(config: pytest.Config) -> None:
    rank = os.environ.get("LOCAL_RANK", "0")
    path = getattr(config.option, "xmlpath", None)
    if path and rank != "0":
        config.option.xmlpath = f"{path.removesuffix('.xml')}.rank{rank}.xml"
