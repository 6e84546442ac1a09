"""The one exception type the tooling raises for user-facing failures."""


class ToolError(Exception):
    """A failure the user can act on; the CLI prints its message as one sentence and exits non-zero."""
