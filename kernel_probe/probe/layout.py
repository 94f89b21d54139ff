"""Parameter layout: does a candidate's state dict take torch.nn's keys, and through which mapping
(from keys and shapes only)? The mapping is its twin's state-dict migration
(``kernel_lock.checkpoint``): ``drop:<key>``, ``rename:<old>-><new>``, ``transpose:<key>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """How the candidate's state maps onto torch.nn's (torch.nn key -> (its key, transposed))."""

    ok: bool
    pairs: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
    rules: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # torch.nn's keys (with shapes) nothing maps to
    unexpected: tuple[str, ...] = ()  # the candidate's keys (with shapes) that map to nothing

    @property
    def identity(self) -> bool:
        """Whether the state dict is torch.nn's as it is (no rule needed)."""
        return self.ok and not self.rules

    def problem(self) -> str:
        """Why no mapping onto torch.nn's state dict exists: the missing and unexpected keys."""
        said = (("missing", self.missing), ("unexpected", self.unexpected))
        parts = [f"{what} {', '.join(keys)}" for what, keys in said if keys]
        return (
            "its state dict does not take torch.nn's keys, and no mapping was found (renamed "
            "keys of equal shapes in declaration order, a transposed weight, a dropped "
            f"_extra_state): {'; '.join(parts)}"
        )

    def to_json(self) -> dict[str, object]:
        """The layout as the worker's reply carries it."""
        return {
            "ok": self.ok,
            "rules": list(self.rules),
            "missing": list(self.missing),
            "unexpected": list(self.unexpected),
            "pairs": {k: [c, t] for k, (c, t) in self.pairs.items()},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Layout:
        """The layout from :meth:`to_json`'s object."""
        raw_pairs = cast("Mapping[object, Sequence[object]]", d.get("pairs") or {})
        pairs = {str(k): (str(v[0]), bool(v[1])) for k, v in dict(raw_pairs).items()}
        lists = (
            tuple(cast("Iterable[str]", d.get(k) or ())) for k in ("rules", "missing", "unexpected")
        )
        return cls(bool(d["ok"]), pairs, *lists)


def _fits(candidate: Shape, reference: Shape) -> tuple[bool, bool]:
    """(fits, transposed)."""
    if tuple(candidate) == tuple(reference):
        return True, False
    if len(reference) == 2 and tuple(reversed(candidate)) == tuple(reference):
        return True, True
    return False, False


def discover(candidate: Mapping[str, Shape], reference: Mapping[str, Shape]) -> Layout:
    """The mapping from the candidate's state-dict keys and shapes onto torch.nn's: ``_extra_state``
    dropped; a key of torch.nn's with the same (or 2-D transposed) shape maps to itself; the keys
    left pair up in declaration order when every pair's shapes fit."""
    rules: list[str] = []
    cand = dict(candidate)
    for key in list(cand):
        if key == "_extra_state" or key.endswith("._extra_state"):
            rules.append(f"drop:{key}")
            del cand[key]
    pairs: dict[str, tuple[str, bool]] = {}
    for key, shape in reference.items():
        if key in cand:
            fits, turned = _fits(cand[key], shape)
            if fits:
                pairs[key] = (key, turned)
    used = {c for c, _ in pairs.values()}
    rest_c = [k for k in cand if k not in used]
    rest_r = [k for k in reference if k not in pairs]
    if rest_c or rest_r:
        matched = len(rest_c) == len(rest_r) and all(
            _fits(cand[c], reference[r])[0] for c, r in zip(rest_c, rest_r, strict=True)
        )
        if not matched:
            return Layout(
                False,
                missing=tuple(f"{k} {tuple(reference[k])}" for k in rest_r),
                unexpected=tuple(f"{k} {tuple(cand[k])}" for k in rest_c),
            )
        for c, r in zip(rest_c, rest_r, strict=True):
            pairs[r] = (c, _fits(cand[c], reference[r])[1])
    for key in reference:  # rules in torch.nn's declaration order
        c, turned = pairs[key]
        if c != key:
            rules.append(f"rename:{c}->{key}")
        if turned:
            rules.append(f"transpose:{key}")
    return Layout(True, {k: pairs[k] for k in reference}, tuple(rules))


def shapes(state: Mapping[str, object]) -> dict[str, Shape]:
    """Key -> shape of a state dict's tensors (anything without a shape counts as a scalar)."""
    return {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}


def describe(rules: Sequence[str]) -> str:
    """The migration rules in words (``identity`` when there are none)."""
    return ", ".join(rules) if rules else "identity"
