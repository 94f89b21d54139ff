"""Fuzz the loader: whatever the input, only a LockError (or a valid lock) comes out."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernel_lock
from kernel_lock import SLOTS, KernelLock, LockError, LockWarning
from kernel_lock.schema import Slot
from kernel_lock.tables import table_keys
from tests.conftest import MINIMAL_LOCK

# thousands of examples: slow, and the fast lane does not import it or hypothesis
# (conftest.SLOW_MODULES)
pytestmark = pytest.mark.slow

# the keys a lock's tables have (top level, slots), then those of the tables inside them
KEYS = list(
    dict.fromkeys(
        [
            *table_keys(KernelLock),
            *SLOTS,
            *table_keys(Slot),
            "rejected",
            "value",
            "match",
            "libraries",
            "name",
            "specifier",
            "module",
            "state-dict",
            "max-error",
            "status",
            "reasons",
            "eps",
            "python",
            "device-type",
            "device-count",
        ]
    )
)
STRINGS = st.sampled_from(
    [
        "1.0",
        "2.0",
        "1.9",
        "torch.nn.LayerNorm",
        "os.system",
        "layer_norm",
        "rms_norm",
        "exact",
        "compatible",
        "ignore",
        "accepted",
        ">=1",
        "~~",
        "sha256:" + "0" * 64,
        "",
        "cpu",
        "training",
        "bf16-mixed",
    ]
) | st.text(max_size=12)
SCALARS = (
    STRINGS
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True)
    | st.booleans()
    | st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2100, 1, 1))
    | st.dates()
)


def _nested(children):
    """Lists and tables of ``children``: the step st.recursive repeats (a named function, so
    hypothesis can read that it uses its argument; it cannot in a lambda spread over several
    lines)."""
    return st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=5
    )


DOCS = st.recursive(SCALARS, _nested, max_leaves=25)


def _check(text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        try:
            lock = kernel_lock.loads(text)
        except LockError:
            return
    # a lock that loads must also dump and reload to the same bytes
    again = kernel_lock.loads(lock.dumps(), emit_warnings=False)
    assert again.dumps() == lock.dumps()


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300) | st.binary(max_size=200))
def test_random_text(text):
    _check(text)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), DOCS, max_size=8))
def test_random_documents(doc):
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):
        return
    _check(text)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_lock(data):
    lines = MINIMAL_LOCK.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "dup", "swap", "garble"]))
        if action == "drop":
            lines.pop(i)
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "swap":
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            pos = data.draw(st.integers(0, max(0, len(lines[i]))))
            lines[i] = lines[i][:pos] + data.draw(st.text(max_size=5)) + lines[i][pos:]
        if not lines:
            break
    _check("\n".join(lines))
