"""What a lock was probed for (model, profile, options, registry libraries), and the one
comparison of two such records, :func:`differences`: ``--check`` (``pipeline.reusable``) and
``kernel-probe diff`` (``derive.lock_differences``) both call it, so they cannot drift. The machine
is compared apart (``verify``, ``lock_differences``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernel_lock.lock import KernelLock
from kernel_lock.model import Model, site_differences
from kernel_probe import slots as slot_behaviour
from kernel_probe.detect.libraries import library_change

# the options of the inputs digest as a person names them: these, and the flags of _FLAGS
OPTION_NAMES = {"shapes": "--shape", "slots": "--slot", "pins": "--pin", "prefers": "--prefer"}
OPTION_NAMES |= {"slot_shapes": "--shape SLOT=SHAPE", "model": "--model (the trace's digest)"}
OPTION_NAMES |= {"candidates": "candidates", "profile": "the profile's digest"}
_FLAGS = "precision with_compile deterministic allow_init_change strict_dtype graph_attention"
_FLAGS += " allow_graph_attention_fallback allow_approximation"
OPTION_NAMES |= {key: "--" + key.replace("_", "-") for key in _FLAGS.split()}


@dataclass(frozen=True)
class Probed:
    """What a lock was probed for (``of_lock``), or what this run probes for (the plan's).
    ``digest``: the inputs digest (None: not recorded); ``options``: the options as the lock
    records them (``recorded_options``); ``libraries``: registry library -> version, "" absent
    (None: not known, not compared); ``profile``: the ``[profile]`` table's name, digest, source."""

    digest: str | None
    options: Mapping[str, Any] | None = None
    libraries: Mapping[str, str] | None = None
    profile: Mapping[str, Any] = field(default_factory=dict)
    model: Model | None = None

    @classmethod
    def of_lock(cls, lock: KernelLock, judged: Mapping[str, Sequence[str]] = {}) -> Probed:
        """What ``lock`` records of its probe (``judged``: library -> its candidates' ids)."""
        options = lock.provenance.get("options")
        return cls(
            digest=lock.provenance.get("inputs"),
            options=options if isinstance(options, Mapping) else None,
            libraries=recorded_libraries(lock, judged),
            profile=dict(lock.profile),
            model=lock.model,
        )


@dataclass(frozen=True)
class Difference:
    """One way two records differ: ``what`` (model, profile, options, libraries), the old and the
    new value (``a``, ``b``: what differs only), and ``why`` in ``--check``'s words (the old one
    is "the lock", the new one "now" or "this run")."""

    what: str
    a: Any
    b: Any
    why: str

    def to_dict(self) -> dict[str, Any]:
        """As ``diff --json`` writes it."""
        return {"what": self.what, "a": self.a, "b": self.b, "why": self.why}


def differences(
    old: Probed, new: Probed, judged: Mapping[str, Sequence[str]] = {}
) -> list[Difference]:
    """How what ``old`` was probed for differs from ``new``'s, most telling first (the model, the
    profile, the options, the libraries); ``judged``: library -> its candidates' ids."""
    found = []
    if why := _other_model(old.model, new.model):
        found.append(Difference("model", _model(old.model), _model(new.model), why))
    if changed := profile_change(old.profile, new.profile):
        a, b = ({k: p.get(k) for k in ("name", "digest")} for p in (old.profile, new.profile))
        found.append(Difference("profile", a, b, changed))
    if old.digest != new.digest:
        was, now = old.options or {}, new.options or {}
        keys = {k for k in {*was, *now} if was.get(k) != now.get(k)}
        a, b = ({k: v for k, v in o.items() if k in keys} for o in (was, now))
        found.append(Difference("options", a, b, options_change(old.options, now)))
    if old.libraries is not None and new.libraries is not None:
        found += _libraries(old.libraries, new.libraries, judged)
    return found


def _libraries(
    old: Mapping[str, str], new: Mapping[str, str], judged: Mapping[str, Sequence[str]]
) -> list[Difference]:
    """The libraries installed in one and not in the other (``library_change``), as one."""
    why = library_change(old, new, judged)
    if why is None:
        return []
    names = [n for n in new if isinstance(old.get(n), str) and bool(old[n]) != bool(new[n])]
    return [Difference("libraries", {n: old[n] for n in names}, {n: new[n] for n in names}, why)]


def _model(model: Model | None) -> str | None:
    return None if model is None else f"{model.spec} ({model.digest})"


def _other_model(locked: Model | None, model: Model | None) -> str:
    """Why a lock probed for ``locked`` (None: no model) is not for ``model``; "" when it is."""
    if model is None:
        if locked is None or not (spec := locked.spec):
            return ""
        return f"it was probed for the model {spec}: check or probe it with --model {spec}"
    if locked is None:
        return "it was not probed for a model (it has no [model] table): probe with --model"
    if locked.digest == model.digest:
        return ""
    said = "; ".join(site_differences(locked, model))
    return f"it was probed for another model or other sizes: {said}"


def profile_change(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why a lock written under ``recorded`` (its [profile] table) is not for ``now``'s profile
    (its ``Profile.lock_record``; empty: none)."""
    name, digest = recorded.get("name"), recorded.get("digest")
    if not now.get("name"):
        return f"it was written under profile {name} and this run applies none" if name else None
    if name != now["name"]:
        return f"it was written under profile {name or 'none'}, this run applies {now['name']}"
    if digest != now.get("digest"):
        return (
            f"profile {name} changed since the lock was written (digest "
            f"{str(digest)[:19]}... -> {str(now.get('digest'))[:19]}..., {now.get('source')})"
        )
    return None


def _option_name(key: str) -> str:
    """How a person names the option behind a digest key (a slot's: its declaring flag)."""
    for s in slot_behaviour.SLOTS.values():
        if s.option is not None and key in s.inputs("", "cpu"):
            return s.option.flag
    return OPTION_NAMES.get(key, key)


def _flat(value: Any) -> Any:
    """An option as the lock records it: a scalar (a list or table joined with ", "; absent: "")."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return value


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value) if value != "" else "none"


def options_change(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str:
    """The options that differ between a lock's (``provenance.options``) and this run's, old and
    new value each; the general reason for an older lock that records none."""
    if not isinstance(recorded, Mapping) or not recorded:
        return "it was probed with other options (shapes, precision, candidates, pins or profile)"
    changes = []
    for key, value in recorded_options(now).items():
        old = recorded.get(key, "")
        if old == value:
            continue
        if key == "candidates" and isinstance(old, str):
            was, new = set(filter(None, old.split(", "))), set(filter(None, value.split(", ")))
            parts = [f"new {', '.join(sorted(new - was))}"] if new - was else []
            parts += [f"no longer {', '.join(sorted(was - new))}"] if was - new else []
            changes.append(f"candidates: {'; '.join(parts)}")
        else:
            changes.append(f"{_option_name(key)}: {_shown(old)} -> {_shown(value)}")
    unknown = sorted(set(recorded) - set(now))
    if unknown:  # a newer kernel-probe's option
        changes.append(f"options this kernel-probe does not know: {', '.join(unknown)}")
    said = "; ".join(changes) or "(the same values, another encoding)"
    return "it was probed with other options: " + said


def recorded_options(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs as the lock records them (``provenance.options``): one scalar each."""
    return {k: _flat(v) for k, v in inputs.items()}


def recorded_libraries(lock: KernelLock, judged: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """What the lock's probe saw installed; a library it did not record (an older lock, or one
    keyed by a submodule before issue 52): "" where all its candidates' rows say not installed."""
    recorded = lock.provenance.get("libraries")
    out = {str(k): str(v) for k, v in recorded.items()} if isinstance(recorded, Mapping) else {}
    for name, ids in judged.items():
        if name in out:
            continue
        rows = [r for s in lock.slots for r in lock.slots[s].rejected if r.implementation in ids]
        if rows and all(any("not installed" in reason for reason in r.reasons) for r in rows):
            out[name] = ""
    return out
