"""Checkpoints that carry their lock (as plain strings, for ``weights_only=True``), and
the state-dict migration a twin may need. No torch."""

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
    "attach",
    "lock_from_checkpoint",
    "migrate_module_state",
    "migrate_state_dict",
    "parse_rule",
]

CHECKPOINT_KEY = "kernel_lock"

log = logging.getLogger("kernel_lock")


def attach(checkpoint: MutableMapping[str, Any], lock: KernelLock) -> MutableMapping[str, Any]:
    """Store ``lock`` in ``checkpoint`` (in place) as text and digest, and return it."""
    text = lock.dumps()
    lock.reads_back("<checkpoint>", text.encode("utf-8"))  # what lock_from_checkpoint will read
    checkpoint[CHECKPOINT_KEY] = {"text": text, "digest": lock.compute_digest()}
    return checkpoint


def lock_from_checkpoint(
    checkpoint: Mapping[str, Any],
    *,
    where: str = "<checkpoint>",
    strict: bool = False,
    emit_warnings: bool = True,
    trust: Iterable[str] = (),
) -> KernelLock:
    """The lock a checkpoint carries, validated and checked against its stored digest."""
    key = CHECKPOINT_KEY

    def bad(problem: str, at: str = key, fix: str | None = None) -> LockFormatError:
        return LockFormatError(problem, path=where, key=at, fix=fix)

    entry = checkpoint.get(key) if isinstance(checkpoint, Mapping) else None
    if entry is None:
        raise bad(
            "the checkpoint carries no kernel lock",
            fix="save checkpoints with kernel_lock.checkpoint.attach(checkpoint, lock), or load "
            "the lock the model was trained with from its file",
        )
    if not isinstance(entry, Mapping):
        raise bad(f"expected a dict with 'text' and 'digest', got {type(entry).__name__}")
    text, digest = entry.get("text"), entry.get("digest")
    if not isinstance(text, str):
        raise bad(f"expected the lock's TOML text, got {type(text).__name__}", f"{key}.text")
    if not isinstance(digest, str):
        raise bad(f"expected 'sha256:<hex>', got {type(digest).__name__}", f"{key}.digest")
    path = f"{where}[{key!r}]"
    lock = loads(text, path=path, strict=strict, emit_warnings=emit_warnings, trust=tuple(trust))
    found = lock.compute_digest()
    if found != digest:
        raise bad(
            f"the lock stored in the checkpoint does not match its digest (stored {digest}, "
            f"content {found})",
            f"{key}.digest",
            fix="the checkpoint was altered after it was saved; restore it, or re-attach the "
            "training lock",
        )
    return lock


# The rules, applied in this order (docs/lock-format.md); keys are local, may contain dots:
# drop:<key> (no counterpart), rename:<a>-><b> (gamma -> weight), transpose:<b> (stored (in, out))
_KEY = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_0-9][\w]*)*$")


@dataclass(frozen=True)
class Rule:
    """One migration step: ``drop:KEY``, ``rename:OLD->NEW`` or ``transpose:KEY``."""

    kind: str
    key: str
    new: str = ""  # rename: the twin's key

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}" + (f"->{self.new}" if self.kind == "rename" else "")


def parse_rule(text: str) -> Rule | None:
    """A migration rule from its text, or None when it is not one this kernel_lock applies."""
    kind, _, arg = text.partition(":")
    if kind == "rename":
        old, sep, new = arg.partition("->")
        ok = sep and _KEY.match(old) and _KEY.match(new) and old != new
        return Rule(kind, old, new) if ok else None
    return Rule(kind, arg) if kind in ("drop", "transpose") and _KEY.match(arg) else None


def migration_rules(slot: Any, *, path: str | None = None) -> list[Rule]:
    """A twin's migration as rules; an unknown rule is a LockFormatError."""
    twin = slot.twin
    if twin is None or twin.state_dict != "migrate":
        return []
    rules = [parse_rule(text) for text in twin.migration]
    for i, rule in enumerate(rules):
        if rule is None:
            raise LockFormatError(
                f"unknown state-dict migration {twin.migration[i]!r}",
                path=path,
                key=f"slots.{slot.name}.twin.migration[{i}]",
                fix="the rules this kernel_lock applies are 'drop:<key>', "
                "'rename:<old>-><new>' and 'transpose:<key>' (docs/lock-format.md); a newer "
                "kernel-probe may write others: upgrade kernel_lock",
            )
    return [r for r in rules if r is not None]


def migrate_module_state(state: Mapping[str, Any], rules: Iterable[Rule]) -> dict[str, Any]:
    """One module's state dict, as the training implementation stores it, in its twin's layout."""
    out, rules = dict(state), list(rules)
    for rule in (r for r in rules if r.kind == "drop"):
        out.pop(rule.key, None)
    for rule in (r for r in rules if r.kind == "rename" and r.key in out):
        out[rule.new] = out.pop(rule.key)
    for rule in rules:
        value = out.get(rule.key)
        if rule.kind == "transpose" and getattr(value, "dim", lambda: 0)() == 2:
            out[rule.key] = value.t().contiguous()  # type: ignore[union-attr]
    return out


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def _transposed(value: Any, shape: tuple[int, ...] | None) -> bool:
    got = _shape(value)
    return shape is not None and got is not None and tuple(reversed(got)) == shape


def migrate_state_dict(
    state_dict: Mapping[str, Any], lock: KernelLock, model: Any
) -> OrderedDict[str, Any]:
    """``state_dict`` made loadable into ``model`` rebuilt in inference mode: a
    twin's rule applies only where ``model`` asks for it, every other key is kept (a misfit still
    fails a strict load). Not modified in place; migrations are logged."""
    if hasattr(model, "state_dict"):
        expected: dict[str, Any] = {k: _shape(v) for k, v in model.state_dict().items()}
    elif isinstance(model, Mapping):
        expected = {
            k: tuple(v) if isinstance(v, (tuple, list)) else _shape(v) for k, v in model.items()
        }
    else:
        expected = dict.fromkeys(model)
    rules = [
        (n, r) for n, slot in lock.slots.items() for r in migration_rules(slot, path=lock.path)
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
    metadata = getattr(state_dict, "_metadata", None)  # module versions torch keeps beside tensors
    if metadata is not None:
        out._metadata = metadata  # type: ignore[attr-defined]  # torch's, OrderedDict lacks it
    return out


def _migrate_one(
    key: str, value: Any, rules: list[tuple[str, Rule]], expected: Mapping[str, Any]
) -> tuple[str | None, Any, str]:
    """The key, value and what was done (``""``: nothing) for one entry of a state dict."""
    shape = expected.get(key)
    if key in expected and (shape is None or _shape(value) is None or _shape(value) == shape):
        return key, value, ""
    for slot, rule in rules:
        if key == rule.key:
            prefix = ""
        elif key.endswith("." + rule.key):
            prefix = key[: -len(rule.key)]
        else:
            continue
        if rule.kind == "drop" and key not in expected:
            return None, value, f"dropped ({slot} twin: {rule})"
        new_key = prefix + rule.new
        if rule.kind == "rename" and key not in expected and new_key in expected:
            how = f"-> {new_key} ({slot} twin: {rule})"
            turned = [
                r for s, r in rules if s == slot and r.kind == "transpose" and r.key == rule.new
            ]
            if turned and _transposed(value, expected[new_key]):
                return new_key, value.t().contiguous(), how + f", {turned[0]}"
            return new_key, value, how
        if rule.kind == "transpose" and key in expected and _transposed(value, expected[key]):
            return key, value.t().contiguous(), f"transposed ({slot} twin: {rule})"
    return key, value, ""
