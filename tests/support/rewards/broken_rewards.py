"""A reward module that fails at import time (tests the one-line error)."""

raise RuntimeError("boom at import")
