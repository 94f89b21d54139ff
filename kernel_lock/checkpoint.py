"""Checkpoints that carry their lock, and the state-dict migration a twin may need.

A checkpoint is whatever dict the training loop saves (``torch.save``). :func:`attach` adds the lock
under one key, as its canonical text and content digest (plain strings, so ``torch.load`` with
``weights_only=True`` reads it back); :func:`lock_from_checkpoint` validates it again and checks the
digest. :func:`migrate_state_dict` applies the twins' recorded migrations, so a state dict saved from
the training implementation loads strictly into the model rebuilt in inference mode.

Not imported by ``import kernel_lock``; torch is never imported here.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from .errors import LockFormatError
from .lock import KernelLock, loads

CHECKPOINT_KEY = "kernel_lock"

log = logging.getLogger("kernel_lock")


def attach(checkpoint: MutableMapping[str, Any], lock: KernelLock) -> MutableMapping[str, Any]:
    """Store ``lock`` in ``checkpoint`` (in place) under ``"kernel_lock"``, and return the checkpoint.

    The entry is ``{"text": <canonical TOML>, "digest": "sha256:..."}``; the digest is that of the
    content, so a lock edited by hand after it was sealed is still stored faithfully (and reported as
    hand-edited when read back, as it would be from its file).
    """
    checkpoint[CHECKPOINT_KEY] = {"text": lock.dumps(), "digest": lock.compute_digest()}
    return checkpoint


def lock_from_checkpoint(checkpoint: Mapping[str, Any], *, where: str = "<checkpoint>", strict: bool = False,
                         emit_warnings: bool = True) -> KernelLock:  # fmt: skip
    """The lock a checkpoint carries, validated like a lock file and checked against its stored digest.

    Raises :class:`LockFormatError` when the checkpoint carries no lock, the entry is malformed, the
    text is not a valid lock, or its content does not match the digest stored beside it.
    """
    key = CHECKPOINT_KEY
    entry = checkpoint.get(key) if isinstance(checkpoint, Mapping) else None
    if entry is None:
        raise LockFormatError("the checkpoint carries no kernel lock", path=where, key=key,
                              fix="save checkpoints with kernel_lock.checkpoint.attach(checkpoint, lock), or load "
                              "the lock the model was trained with from its file")  # fmt: skip
    if not isinstance(entry, Mapping):
        raise LockFormatError(f"expected a dict with 'text' and 'digest', got {type(entry).__name__}", path=where, key=key)
    text, digest = entry.get("text"), entry.get("digest")
    if not isinstance(text, str):
        raise LockFormatError(f"expected the lock's TOML text, got {type(text).__name__}", path=where, key=f"{key}.text")
    if not isinstance(digest, str):
        raise LockFormatError(f"expected 'sha256:<hex>', got {type(digest).__name__}", path=where, key=f"{key}.digest")
    lock = loads(text, path=f"{where}[{key!r}]", strict=strict, emit_warnings=emit_warnings)
    found = lock.compute_digest()
    if found != digest:
        raise LockFormatError(
            f"the lock stored in the checkpoint does not match its digest (stored {digest}, content {found})",
            path=where,
            key=f"{key}.digest",
            fix="the checkpoint was altered after it was saved; restore it, or re-attach the training lock",
        )
    return lock


MIGRATIONS = ("drop",)  # the state-dict migration rules this kernel_lock applies: 'drop:<key name>'


def migration_rules(slot: Any, *, path: str | None = None) -> list[tuple[str, str]]:
    """A twin's migration as (kind, argument) pairs; an unknown rule is a LockFormatError."""
    twin = slot.twin
    if twin is None or twin.state_dict != "migrate":
        return []
    rules = []
    for i, rule in enumerate(twin.migration):
        kind, _, arg = rule.partition(":")
        if kind not in MIGRATIONS or not arg or "." in arg:
            raise LockFormatError(
                f"unknown state-dict migration {rule!r}",
                path=path,
                key=f"slots.{slot.name}.twin.migration[{i}]",
                fix="the rules this kernel_lock applies are 'drop:<key name>', e.g. 'drop:_extra_state'",
            )
        rules.append((kind, arg))
    return rules


def _drop_suffixes(lock: KernelLock) -> dict[str, str]:
    """Key suffix -> the slot whose twin migration drops it (``drop:<suffix>`` rules)."""
    out: dict[str, str] = {}
    for name, slot in lock.slots.items():
        for kind, arg in migration_rules(slot, path=lock.path):
            if kind == "drop":
                out[arg] = name
    return out


def migrate_state_dict(state_dict: Mapping[str, Any], lock: KernelLock, model: Any) -> OrderedDict[str, Any]:
    """``state_dict`` (saved under ``lock``) made loadable into ``model`` (rebuilt in inference mode).

    The rule is deliberately narrow: a key is dropped when ``model`` does not expect it *and* its last
    component is named by a ``drop:<name>`` migration of a slot whose twin has ``state-dict =
    "migrate"`` (transformer-engine's ``_extra_state``). Every other key is kept, so anything else
    that does not fit still fails ``load_state_dict(strict=True)`` loudly. ``model`` is an
    ``nn.Module`` or the collection of its state-dict keys; where a slot was not substituted (the
    library is installed here), its module still has the key and the key is kept. ``state_dict`` is
    not modified; the dropped keys are logged (INFO, logger ``kernel_lock``).

    ``lock`` is the lock the state dict was saved under (what :func:`lock_from_checkpoint` returns),
    or an inference lock derived from it: a derived lock keeps each substituted slot's twin record.
    """
    expected: Iterable[str] = model.state_dict().keys() if hasattr(model, "state_dict") else model
    wanted = set(expected)
    suffixes = _drop_suffixes(lock)
    out: OrderedDict[str, Any] = OrderedDict()
    dropped = []
    for key, value in state_dict.items():
        last = key.rpartition(".")[2]
        if key not in wanted and last in suffixes:
            dropped.append(f"{key} ({suffixes[last]} twin: drop:{last})")
            continue
        out[key] = value
    if dropped:
        log.info("kernel_lock: state-dict migration dropped %d key(s): %s", len(dropped), ", ".join(dropped))
    metadata = getattr(state_dict, "_metadata", None)  # module versions torch keeps beside the tensors
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]
    return out
