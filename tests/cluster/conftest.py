"""Makes the cluster fixtures available to tests/cluster/ itself.  Other suites: see fixtures.py."""

from .fixtures import *  # noqa: F401,F403
