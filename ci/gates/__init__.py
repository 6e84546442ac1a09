"""Upstream's gates at every pull request of the series (``ci/upstream_gates.py``): one module per gate."""
