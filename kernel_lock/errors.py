"""The one error family of kernel_lock: each error names where (file, dotted key), what, and the
fix, and carries its documented exit code (``ExitCode``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "EXIT_CODES",
    "BadEnvironmentVariable",
    "DeviceVisibilityError",
    "Difference",
    "ExitCode",
    "KernelUnavailable",
    "LockError",
    "LockFormatError",
    "LockMismatch",
    "LockVersionError",
    "LockWarning",
    "RanksDisagree",
    "TargetNotAllowed",
]


class ExitCode(IntEnum):
    """The exit codes of every kernel-probe command, each with its ``meaning``."""

    meaning: str

    def __new__(cls, code: int, meaning: str) -> ExitCode:
        member = int.__new__(cls, code)
        member._value_ = code
        member.meaning = meaning
        return member

    def __str__(self) -> str:  # the number, as format() gives it (3.10 would say ExitCode.OK)
        return str(self.value)

    OK = 0, "ok"
    FAILURE = (
        1,
        "other failure (a bug, an interrupted run, a library that crashed the probe itself, "
        "no candidate of a slot accepted)",
    )
    USAGE = (
        2,
        "usage error (bad command-line arguments, a malformed $KERNEL_LOCK_TRUST, or environment "
        "variables that contradict each other, such as HIP_VISIBLE_DEVICES naming more devices "
        "than ROCR_VISIBLE_DEVICES allows)",
    )
    MISMATCH = (
        3,
        "the environment does not match the lock, the lock is stale or missing (`--check`), "
        "or a pinned or preferred kernel cannot be used here",
    )
    PROFILE_UNMET = 4, "the machine does not meet the site profile"
    BAD_INPUT = (
        5,
        "malformed input file (lock, profile, config): not TOML, wrong types, unknown keys, "
        "disallowed targets, missing or unreadable path",
    )
    # `kernel-probe diff --exit-code`: not a failure, so not 1 as in `git diff --exit-code`
    LOCKS_DIFFER = 6, "the compared locks differ (`kernel-probe diff --exit-code` only)"


class LockError(Exception):
    """Base of every error kernel_lock raises on purpose."""

    exit_code: int = ExitCode.FAILURE  # an int: a code read back from another rank fits too

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        key: str | None = None,
        fix: str | None = None,
    ):
        self.path, self.key, self.problem, self.fix = path, key, message, fix
        super().__init__(self._render())

    def _render(self) -> str:
        where = ": ".join(p for p in (self.path, f"'{self.key}'" if self.key else None) if p)
        text = f"{where}: {self.problem}" if where else self.problem
        return text + (f"\n  fix: {self.fix}" if self.fix else "")


class LockFormatError(LockError, ValueError):
    """The lock (or another input file) is not valid: not TOML, wrong types, missing keys, ..."""

    exit_code = ExitCode.BAD_INPUT


class LockVersionError(LockFormatError):
    """The lock's major ``lock-version`` is one this kernel_lock does not understand."""


class TargetNotAllowed(LockFormatError):
    """A target is outside the import allow-list, or is not a ``torch.nn.Module`` subclass."""


@dataclass(frozen=True)
class Difference:
    """One fingerprint field (or library) where this machine differs from the lock."""

    field: str
    expected: object
    found: object
    rule: str

    def __str__(self) -> str:
        return (
            f"{self.field}: lock has {self.expected!r}, this machine has {self.found!r} "
            f"(match = {self.rule})"
        )


class LockMismatch(LockError):
    """This machine is not the one the lock was probed on (or lacks what it pins)."""

    exit_code = ExitCode.MISMATCH

    def __init__(
        self, differences: list[Difference], *, path: str | None = None, fix: str | None = None
    ):
        self.differences = list(differences)
        lines = "\n".join(f"  - {d}" for d in self.differences)
        super().__init__(
            f"the environment does not match the lock ({len(self.differences)} field(s)):\n{lines}",
            path=path,
            key="environment",
            fix=fix
            or "re-run `kernel-probe --force` on this machine to write a lock for it, relax the "
            "field's `match` rule in the lock if the difference is harmless, or use the matching "
            "machine",
        )


class KernelUnavailable(LockError):
    """A slot's implementation cannot be built here (library missing or broken), no way out."""

    exit_code = ExitCode.MISMATCH


class RanksDisagree(LockError):
    """Raised on every rank by ``check_ranks``: each rank's ``reports``, the ``ranks`` at fault."""

    exit_code = ExitCode.MISMATCH

    def __init__(
        self,
        message: str,
        *,
        reports: list[dict] | None = None,
        ranks: list[int] | None = None,
        fix: str | None = None,
    ):
        self.reports, self.ranks = list(reports or []), list(ranks or [])
        super().__init__(message, fix=fix)


class DeviceVisibilityError(LockError):
    """The device-visibility variables contradict each other: which GPUs are used is undefined."""

    exit_code = ExitCode.USAGE


class BadEnvironmentVariable(LockError, ValueError):
    """$KERNEL_LOCK_TRUST (or an argument standing for it) is malformed: a usage error (exit 2)."""

    exit_code = ExitCode.USAGE


class LockWarning(UserWarning):
    """Worth knowing, does not stop resolution (a hand-edited lock, a newer minor version)."""


EXIT_CODES = {int(code): code.meaning for code in ExitCode}  # code -> meaning, as a plain dict
