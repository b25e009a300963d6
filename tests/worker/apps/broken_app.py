"""A handler module with a bug at import time (for the CLI error tests)."""

raise RuntimeError("this module is broken on purpose")
