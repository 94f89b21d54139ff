"""Issue 52, the property over the typed readers and writers: any value the lock writer accepts,
the reader reads back equal, and the writer accepts exactly the values the slot declares
(``SlotSpec.params``), integers within 64 bits, numbers finite where a slot's keyword holds them.
Hypothesis: slow (conftest.SLOW_MODULES)."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel_lock
from kernel_lock import LockFormatError
from kernel_lock.schema import EnvField
from kernel_lock.slots import SPECS
from kernel_lock.slots.base import Param
from kernel_lock.tables import INT64
from kernel_probe.output import json_numbers
from kernel_probe.slots.attention import Geometry, parse_geometry

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "locks"
_PROBED = kernel_lock.load(DATA / "probe-cpu-32-true.toml", emit_warnings=False)
_EVERY = kernel_lock.load(DATA / "build-lock-every-slot.toml", emit_warnings=False)
LOCK = replace(_PROBED, slots={**_PROBED.slots, "GatedMLP": _EVERY.slots["GatedMLP"]})
assert set(LOCK.slots) == set(SPECS)
# (slot, keyword): every keyword a slot declares; mlp_implementation's gate is its own key
DECLARED = [
    (s.name, k)
    for s in SPECS.values()
    for k in s.params
    if (s.name, k) != ("GatedMLP", "mlp_implementation")
]
SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid(param: Param) -> st.SearchStrategy:
    """Values ``param`` declares valid."""
    if param.choices:
        return st.sampled_from(param.choices)
    if param.type is bool:
        return st.booleans()
    if param.type is int:
        return st.integers(int(max(param.low, -(2**63))), int(min(param.high, 2**63 - 1)))
    return st.floats(param.low, param.high, allow_nan=False, allow_infinity=False)


def _canonical(value):
    return json.dumps(value, sort_keys=True)  # nan as NaN on both sides: equal to itself


def _write_and_read(lock):
    """The lock as the writer leaves it on disk, read back; LockFormatError when refused."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel-lock.toml"
        try:
            lock.sealed().dump(path)
        except LockFormatError:
            assert not path.exists()
            raise
        return kernel_lock.load(path, emit_warnings=False, strict=True)


def _with_kwarg(slot: str, name: str, value):
    """LOCK with ``name = value`` pinned for ``slot``, and for its twin where the twin takes it (a
    twin computing other than its target is the computation judge's refusal, not a type's); what the
    slot declares (a function, a gate) follows a declared value, as the probe would write it."""
    pinned = LOCK.slots[slot]
    kwargs = {**pinned.kwargs, name: value}
    twin = pinned.twin
    if twin is not None and (name in twin.kwargs or twin.target == pinned.target):
        twin = replace(twin, kwargs={**twin.kwargs, name: value})
    extra, spec = dict(pinned.extra), SPECS[slot]
    if spec.params[name].problem(value) is None and spec.computes is not None:
        computed = spec.computes(pinned.target, kwargs, None) or {}
        keys = {key.name for key in spec.keys}  # a key the table may omit (Attention's causal)
        extra.update({k: v for k, v in computed.items() if k in extra or k in keys})
    entry = replace(pinned, kwargs=kwargs, twin=twin, extra=extra)
    return replace(LOCK, slots={**LOCK.slots, slot: entry})


@EXAMPLES
@given(data=st.data())
def test_a_slot_keyword_the_writer_accepts_reads_back_equal(data):
    slot, name = data.draw(st.sampled_from(DECLARED))
    param = SPECS[slot].params[name]
    value = data.draw(st.one_of(SCALARS, _valid(param)))
    try:
        again = _write_and_read(_with_kwarg(slot, name, value))
    except LockFormatError as exc:
        assert param.problem(value) is not None, (slot, name, value, exc)
        return
    assert param.problem(value) is None
    read = again.slots[slot].kwargs[name]
    assert type(read) is type(value) and read == value


@EXAMPLES
@given(data=st.data())
def test_every_value_a_slot_declares_is_written(data):
    slot, name = data.draw(st.sampled_from(DECLARED))
    value = data.draw(_valid(SPECS[slot].params[name]))
    assert _write_and_read(_with_kwarg(slot, name, value)).slots[slot].kwargs[name] == value


@EXAMPLES
@given(row=st.dictionaries(st.from_regex(r"[a-z][a-z-]{0,8}", fullmatch=True), SCALARS, max_size=6))
def test_an_evidence_row_the_writer_accepts_reads_back_equal(row):
    pinned = LOCK.slots["Linear"]
    lock = replace(LOCK, slots={**LOCK.slots, "Linear": replace(pinned, evidence=(row,))})
    wide = [v for v in row.values() if isinstance(v, int) and not -INT64 <= v < INT64]
    try:
        again = _write_and_read(lock)
    except LockFormatError:
        assert wide and not isinstance(wide[0], bool)
        return
    assert not wide
    assert _canonical(again.slots["Linear"].evidence[0]) == _canonical(row)
    # and --json writes it as strict JSON, nan and inf as TOML spells them
    text = json.dumps(json_numbers(row), allow_nan=False)
    back = json.loads(text)
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            assert back[key] == ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf")
        else:
            assert back[key] == value


@EXAMPLES
@given(value=st.integers(min_value=-(2**70), max_value=2**70))
def test_an_environment_integer_the_writer_accepts_reads_back_equal(value):
    env = replace(
        LOCK.environment,
        fields={**LOCK.environment.fields, "device-count": EnvField(value=value, match="ignore")},
    )
    try:
        again = _write_and_read(replace(LOCK, environment=env))
    except LockFormatError:
        assert not -INT64 <= value < INT64
        return
    assert again.environment.fields["device-count"].value == value


@EXAMPLES
@given(data=st.data())
def test_an_attention_option_the_command_line_takes_is_the_slots(data):
    """--attention parses by the slot's declarations: what it accepts prints and parses back."""
    params = SPECS["Attention"].params
    names = data.draw(st.sets(st.sampled_from(["window", "softcap", "dropout", "alibi"])))
    options = tuple((n, data.draw(_valid(params[n]))) for n in sorted(names))
    geometry = Geometry(4, 8, 16, options)
    assert parse_geometry(str(geometry)) == geometry
