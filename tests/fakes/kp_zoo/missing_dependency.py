"""Needs a package that is not installed."""

import kp_this_dependency_does_not_exist  # noqa: F401
