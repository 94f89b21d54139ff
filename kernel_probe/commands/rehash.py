"""``kernel-probe rehash [LOCK]``: accept deliberate hand edits by recomputing the lock's digest.
The lock is still fully validated, and every target decided as the job-start check decides it
without importing and, where only an import can tell, by importing it in a child process
(``kernel_lock.launch.before_sealing``): a lock that ``verify`` and the runtime would
refuse is not sealed. The lock is rewritten atomically."""

from __future__ import annotations

import argparse

import kernel_lock
from kernel_lock.launch import before_sealing
from kernel_probe import output
from kernel_probe.commands.lockfile import add_lock_argument, add_trust_argument, default_lock_path


def add_rehash_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe rehash``."""
    add_lock_argument(p, "lock file to re-seal after a deliberate hand edit")
    add_trust_argument(p)


def run_rehash(args: argparse.Namespace) -> int:
    """``kernel-probe rehash LOCK``: re-seal a validated lock after a deliberate hand edit."""
    args.lock = args.lock or default_lock_path()
    # still fully validated
    lock = kernel_lock.load(args.lock, emit_warnings=False, trust=args.trust)
    # raises what verify would certainly refuse
    unjudged = before_sealing(lock, _torch_version(lock))
    sealed = lock.sealed()
    sealed.dump(args.lock)
    output.info(
        f"{args.lock}: digest {'unchanged' if sealed.digest == lock.digest else 'updated'} "
        f"({sealed.digest})"
    )
    for line in unjudged:
        output.info(f"  note: {line}")
    return 0


def _torch_version(lock: kernel_lock.KernelLock) -> str:
    """The torch the lock's classes are judged for: the lock's own, else this machine's (read
    without importing torch); empty when neither is known (torch.nn's targets are then not
    judged)."""
    from kernel_lock.fingerprint import Unsettled, torch_build

    recorded = lock.environment.fields.get("torch")
    if recorded is not None:
        return str(recorded.value)
    try:
        return torch_build().version
    except Unsettled:
        return ""
