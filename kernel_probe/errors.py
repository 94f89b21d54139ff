"""The probe's errors, each with the exit code the CLI returns for it (kernel_lock's ExitCode)."""

from __future__ import annotations

from kernel_lock.errors import ExitCode, LockError


class ProbeError(LockError):
    """A failure the user can act on; ``exit_code`` is one of kernel_lock's ExitCode."""

    exit_code: int = ExitCode.FAILURE  # an int, as LockError's: RankFailed carries another's code


class UsageError(ProbeError):
    """A command line that cannot mean anything: a bad value, a flag without the one it needs."""

    exit_code = ExitCode.USAGE


class StaleLock(ProbeError):
    """``--check``: the lock is missing, broken or does not match this machine."""

    exit_code = ExitCode.MISMATCH


class ForcedUnusable(ProbeError):
    """A ``--pin``/``--prefer`` (or a profile's pin) names a candidate unusable on this machine."""

    exit_code = ExitCode.MISMATCH


class TooLarge(ProbeError):
    """A slot's shape this device cannot time (``Slot.too_large``), refused before any work."""

    exit_code = ExitCode.MISMATCH


class NodeDiffers(ProbeError):
    """A waiting rank's node does not match the lock the probing rank wrote for the job."""

    exit_code = ExitCode.MISMATCH


class ProfileUnmet(ProbeError):
    """The machine (or a described node) does not meet the site profile, or no profile matches."""

    exit_code = ExitCode.PROFILE_UNMET


class InputFileError(ProbeError):
    """A file the probe reads is missing, unreadable or malformed (a config, a lock to reuse)."""

    exit_code = ExitCode.BAD_INPUT
