"""Errors of the probe itself, each with the exit code the CLI returns for it."""

from __future__ import annotations

from kernel_lock.errors import LockError


class ProbeError(LockError):
    """A failure the user can act on; ``exit_code`` follows kernel_lock.EXIT_CODES."""

    exit_code = 1


class UsageError(ProbeError):
    exit_code = 2


class StaleLock(ProbeError):
    """``--check``: the lock is missing, broken or does not match this machine."""

    exit_code = 3


class ForcedUnusable(ProbeError):
    """A ``--pin``/``--prefer`` (or a profile's pin) names a candidate that cannot be used on this machine."""

    exit_code = 3


class NodeDiffers(ProbeError):
    """A waiting rank's node does not match the lock the probing rank wrote for the job."""

    exit_code = 3


class ProfileUnmet(ProbeError):
    exit_code = 4


class InputFileError(ProbeError):
    exit_code = 5
