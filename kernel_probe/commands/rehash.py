"""``kernel-probe rehash [LOCK]``: accept deliberate hand edits by recomputing the lock's digest (the lock is
still fully validated, and rewritten atomically)."""

from __future__ import annotations

import argparse

import kernel_lock
from kernel_probe import output
from kernel_probe.commands.lockfile import add_lock_argument, add_trust_argument, default_lock_path


def add_rehash_arguments(p: argparse.ArgumentParser) -> None:
    add_lock_argument(p, "lock file to re-seal after a deliberate hand edit")
    add_trust_argument(p)


def run_rehash(args: argparse.Namespace) -> int:
    args.lock = args.lock or default_lock_path()
    lock = kernel_lock.load(args.lock, emit_warnings=False, trust=args.trust)  # still fully validated
    sealed = lock.sealed()
    sealed.dump(args.lock)
    output.info(f"{args.lock}: digest {'unchanged' if sealed.digest == lock.digest else 'updated'} ({sealed.digest})")
    return 0
