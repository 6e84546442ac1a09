"""Checks this repository's CI runs: the bisect and upstream replay checks, lint, and the Intel GPU tier."""
