"""How a subcommand names and reads a lock file: the default path, the LOCK argument, ``--trust``
and loading with the lock's warnings on stderr (verify, show, rehash, explain, diff, lock,
export)."""

from __future__ import annotations

import argparse
import os

import kernel_lock
from kernel_lock.errors import LockError
from kernel_probe import output

DEFAULT_LOCK = "kernel-lock.toml"


def default_lock_path() -> str:
    """The lock a command reads when none is named: $KERNEL_LOCK, else ./kernel-lock.toml."""
    return os.environ.get("KERNEL_LOCK", DEFAULT_LOCK)


def add_lock_argument(p: argparse.ArgumentParser, what: str = "lock file") -> None:
    """The optional LOCK positional (``args.lock``, None when not given: see
    ``default_lock_path``)."""
    p.add_argument(
        "lock", nargs="?", default=None, help=f"{what} (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})"
    )


TRUST_HELP = (
    "trust this top-level package beyond the built-in allow-list (repeatable; also "
    "$KERNEL_LOCK_TRUST). A lock's own trusted-modules only ask for it"
)


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    """``--trust MODULE`` (repeatable, ``args.trust``): packages a lock may import beyond the
    allow-list."""
    p.add_argument("--trust", action="append", default=[], metavar="MODULE", help=TRUST_HELP)


def load_lock(
    path: str,
    strict: bool = False,
    *,
    trust: list[str] | tuple[str, ...] = (),
    check_targets: bool = True,
) -> kernel_lock.KernelLock:
    """Load a lock for a command; its warnings go to stderr. ``check_targets=False`` for commands
    that only print a lock (nothing is imported)."""
    try:
        lock = kernel_lock.load(
            path, strict=strict, emit_warnings=False, trust=trust, check_targets=check_targets
        )
    except LockError as exc:
        env = os.environ.get("KERNEL_LOCK")
        if env is None or env != path or os.path.isfile(path):
            raise
        # a lock that is not there, named by the environment rather than by the user: say where it
        # came from
        exc.problem += " ($KERNEL_LOCK names this path)"
        exc.fix = (
            "unset KERNEL_LOCK or point it at the lock, or name the lock on the command "
            f"line; {exc.fix or ''}"
        ).rstrip("; ")
        exc.args = (exc._render(),)
        raise
    for message in lock.warnings:
        output.warn(message)
    return lock
