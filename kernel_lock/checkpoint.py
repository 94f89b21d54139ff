"""Checkpoints that carry their lock, and the state-dict migration a twin may need.

A checkpoint is whatever dict the training loop saves (``torch.save``). :func:`attach` adds the lock
under one key, as its canonical text and content digest (plain strings, so ``torch.load`` with
``weights_only=True`` reads it back); :func:`lock_from_checkpoint` validates it again and checks the
digest. :func:`migrate_state_dict` applies the twins' recorded migrations, so a state dict saved
from the training implementation loads strictly into the model rebuilt in inference mode.

Not imported by ``import kernel_lock``; torch is never imported here.

One of kernel_lock's integrations (with ``anemoi``, ``distributed`` and ``portability``), kept at
the path the docs show.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from .errors import LockFormatError
from .lock import KernelLock, loads

__all__ = [
    "CHECKPOINT_KEY",
    "MIGRATIONS",
    "Rule",
    "attach",
    "lock_from_checkpoint",
    "migrate_module_state",
    "migrate_state_dict",
    "migration_rules",
    "parse_rule",
]

CHECKPOINT_KEY = "kernel_lock"

log = logging.getLogger("kernel_lock")


def attach(checkpoint: MutableMapping[str, Any], lock: KernelLock) -> MutableMapping[str, Any]:
    """Store ``lock`` in ``checkpoint`` (in place) under ``"kernel_lock"``, and return the
    checkpoint.

    The entry is ``{"text": <canonical TOML>, "digest": "sha256:..."}``; the digest is that of the
    content, so a lock edited by hand after it was sealed is still stored faithfully (and reported
    as hand-edited when read back, as it would be from its file).
    """
    checkpoint[CHECKPOINT_KEY] = {"text": lock.dumps(), "digest": lock.compute_digest()}
    return checkpoint


def lock_from_checkpoint(
    checkpoint: Mapping[str, Any],
    *,
    where: str = "<checkpoint>",
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Iterable[str] = (),
) -> KernelLock:
    """The lock a checkpoint carries, validated like a lock file and checked against its stored
    digest.

    Raises :class:`LockFormatError` when the checkpoint carries no lock, the entry is malformed, the
    text is not a valid lock, or its content does not match the digest stored beside it. A lock
    inside a checkpoint is no more trusted than a file: ``trust`` grants what its
    ``trusted-modules`` ask.
    """
    key = CHECKPOINT_KEY
    entry = checkpoint.get(key) if isinstance(checkpoint, Mapping) else None
    if entry is None:
        raise LockFormatError(
            "the checkpoint carries no kernel lock",
            path=where,
            key=key,
            fix="save checkpoints with kernel_lock.checkpoint.attach(checkpoint, lock), or load "
            "the lock the model was trained with from its file",
        )
    if not isinstance(entry, Mapping):
        raise LockFormatError(
            f"expected a dict with 'text' and 'digest', got {type(entry).__name__}",
            path=where,
            key=key,
        )
    text, digest = entry.get("text"), entry.get("digest")
    if not isinstance(text, str):
        raise LockFormatError(
            f"expected the lock's TOML text, got {type(text).__name__}",
            path=where,
            key=f"{key}.text",
        )
    if not isinstance(digest, str):
        raise LockFormatError(
            f"expected 'sha256:<hex>', got {type(digest).__name__}", path=where, key=f"{key}.digest"
        )
    lock = loads(
        text,
        path=f"{where}[{key!r}]",
        strict=strict,
        emit_warnings=emit_warnings,
        trust=tuple(trust),
    )
    found = lock.compute_digest()
    if found != digest:
        raise LockFormatError(
            f"the lock stored in the checkpoint does not match its digest (stored {digest}, "
            f"content {found})",
            path=where,
            key=f"{key}.digest",
            fix="the checkpoint was altered after it was saved; restore it, or re-attach the "
            "training lock",
        )
    return lock


# The state-dict migration rules this kernel_lock applies, written from the training
# implementation's keys to its twin's (the probe finds them by matching keys and shapes;
# docs/lock-format.md):
#   drop:<key>         the key has no counterpart in the twin (transformer-engine's _extra_state)
#   rename:<a>-><b>    the parameter is stored as <a>, the twin calls it <b> (gamma -> weight)
#   transpose:<b>      the twin's <b> is the transpose of what is stored (a weight kept (in, out))
# Keys are local to the module (they may contain dots: norm.weight); applied in that order.
MIGRATIONS = ("drop", "rename", "transpose")
_KEY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_0-9][\w]*)*$")


@dataclass(frozen=True)
class Rule:
    """One state-dict migration step of a twin: ``drop:KEY``, ``rename:OLD->NEW`` or
    ``transpose:KEY``."""

    kind: str  # drop | rename | transpose
    key: str  # the stored key (drop, rename) or the twin's key (transpose)
    new: str = ""  # rename: the twin's key

    def __str__(self) -> str:
        return (
            f"rename:{self.key}->{self.new}" if self.kind == "rename" else f"{self.kind}:{self.key}"
        )


def parse_rule(text: str) -> Rule | None:
    """A migration rule from its text, or None when it is not one this kernel_lock applies."""
    kind, _, arg = text.partition(":")
    if kind == "rename":
        old, sep, new = arg.partition("->")
        if sep and _KEY.match(old) and _KEY.match(new) and old != new:
            return Rule(kind, old, new)
        return None
    if kind in ("drop", "transpose") and _KEY.match(arg):
        return Rule(kind, arg)
    return None


def migration_rules(slot: Any, *, path: str | None = None) -> list[Rule]:
    """A twin's migration as rules; an unknown rule is a LockFormatError."""
    twin = slot.twin
    if twin is None or twin.state_dict != "migrate":
        return []
    rules = []
    for i, text in enumerate(twin.migration):
        rule = parse_rule(text)
        if rule is None:
            raise LockFormatError(
                f"unknown state-dict migration {text!r}",
                path=path,
                key=f"slots.{slot.name}.twin.migration[{i}]",
                fix="the rules this kernel_lock applies are 'drop:<key>', "
                "'rename:<old>-><new>' and 'transpose:<key>' (docs/lock-format.md); a newer "
                "kernel-probe may write others: upgrade kernel_lock",
            )
        rules.append(rule)
    return rules


def migrate_module_state(state: Mapping[str, Any], rules: Iterable[Rule]) -> dict[str, Any]:
    """One module's state dict (local keys), stored by the training implementation, in its twin's
    layout."""
    out = dict(state)
    rules = list(rules)
    for rule in rules:
        if rule.kind == "drop":
            out.pop(rule.key, None)
    for rule in rules:
        if rule.kind == "rename" and rule.key in out:
            out[rule.new] = out.pop(rule.key)
    for rule in rules:
        if (
            rule.kind == "transpose"
            and rule.key in out
            and getattr(out[rule.key], "dim", lambda: 0)() == 2
        ):
            out[rule.key] = out[rule.key].t().contiguous()
    return out


def _suffix(key: str, local: str) -> str | None:
    """The module prefix of ``key`` if it ends with the local key ``local`` ('' or 'a.b.'), else
    None."""
    if key == local:
        return ""
    if key.endswith("." + local):
        return key[: -len(local)]
    return None


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def migrate_state_dict(
    state_dict: Mapping[str, Any], lock: KernelLock, model: Any
) -> OrderedDict[str, Any]:
    """``state_dict`` (saved under ``lock``) made loadable into ``model`` (rebuilt in inference
    mode).

    The rules are the lock's twin migrations (slots whose twin has ``state-dict = "migrate"``), and
    they apply only where ``model`` says they must: a key is dropped when ``model`` does not expect
    it and a ``drop:`` rule names it; renamed when ``model`` expects the new name and not the old;
    transposed when ``model`` expects the transposed shape. Every other key is kept as it is, so
    anything else that does not fit still fails ``load_state_dict(strict=True)`` loudly. ``model``
    is an ``nn.Module``, a mapping of its state-dict keys to tensors (or shapes), or the collection
    of its keys (then shapes are unknown and no transpose applies). Where a slot was not substituted
    (the library is installed here), its module still has the stored keys and they are kept.
    ``state_dict`` is not modified; what was migrated is logged (INFO, logger ``kernel_lock``).

    ``lock`` is the lock the state dict was saved under (what :func:`lock_from_checkpoint` returns),
    or an inference lock derived from it: a derived lock keeps each substituted slot's twin record.
    """
    if hasattr(model, "state_dict"):
        expected: dict[str, Any] = {k: _shape(v) for k, v in model.state_dict().items()}
    elif isinstance(model, Mapping):
        expected = {
            k: (tuple(v) if isinstance(v, (tuple, list)) else _shape(v)) for k, v in model.items()
        }
    else:
        expected = {k: None for k in model}
    rules = [
        (name, rule)
        for name, slot in lock.slots.items()
        for rule in migration_rules(slot, path=lock.path)
    ]
    out: OrderedDict[str, Any] = OrderedDict()
    done = []
    for key, value in state_dict.items():
        new_key, new_value, how = _migrate_one(key, value, rules, expected)
        if how:
            done.append(f"{key}: {how}")
        if new_key is not None:
            out[new_key] = new_value
    if done:
        log.info("kernel_lock: state-dict migration: %s", "; ".join(done))
    # module versions torch keeps beside the tensors
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]  # torch's attribute, which OrderedDict does not declare
    return out


def _fits(value: Any, shape: tuple[int, ...] | None) -> bool:
    return shape is None or _shape(value) is None or _shape(value) == shape


def _migrate_one(
    key: str, value: Any, rules: list[tuple[str, Rule]], expected: Mapping[str, Any]
) -> tuple[str | None, Any, str]:
    if key in expected and _fits(value, expected[key]):
        return key, value, ""
    for slot, rule in rules:
        prefix = _suffix(key, rule.key)
        if prefix is None:
            continue
        if rule.kind == "drop" and key not in expected:
            return None, value, f"dropped ({slot} twin: {rule})"
        if rule.kind == "rename" and key not in expected and prefix + rule.new in expected:
            new_key = prefix + rule.new
            how = f"-> {new_key} ({slot} twin: {rule})"
            turned = [
                r for s, r in rules if s == slot and r.kind == "transpose" and r.key == rule.new
            ]
            shape = expected[new_key]
            if (
                turned
                and shape is not None
                and (got := _shape(value)) is not None
                and tuple(reversed(got)) == shape
            ):
                return new_key, value.t().contiguous(), how + f", {turned[0]}"
            return new_key, value, how
        if rule.kind == "transpose" and key in expected:
            shape = expected[key]
            if (
                shape is not None
                and (got := _shape(value)) is not None
                and tuple(reversed(got)) == shape
            ):
                return key, value.t().contiguous(), f"transposed ({slot} twin: {rule})"
    return key, value, ""
