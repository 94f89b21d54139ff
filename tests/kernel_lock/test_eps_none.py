"""RMSNorm's eps=None (torch's own: its accumulation type's machine epsilon) in a lock: written
``"none"``, read back as None for a keyword that takes None only (issue 53)."""

from __future__ import annotations

import pytest

import kernel_lock
from kernel_lock.model import NONE_VALUE as MODEL_NONE
from kernel_lock.slots.base import NONE_VALUE
from tests.conftest import MINIMAL_LOCK

RMS = 'semantics = "rms_norm"\nkwargs = { eps = 1e-6 }'
TWIN = (
    'semantics = "rms_norm"\nkwargs = { eps = "none" }\ntwin = { target = "torch.nn.RMSNorm", '
    'kwargs = { eps = "none" }, state-dict = "interchangeable" }'
)


def test_none_is_spelt_as_the_model_table_spells_it():
    assert NONE_VALUE == MODEL_NONE == "none"


def test_an_rms_norm_eps_of_none_reads_as_none_and_builds_torchs():
    lock = kernel_lock.loads(MINIMAL_LOCK.replace(RMS, TWIN), emit_warnings=False)
    slot = lock.slots["RMSNorm"]
    assert (
        slot.kwargs == {"eps": None} and slot.twin is not None and slot.twin.kwargs["eps"] is None
    )
    assert lock.dumps().count('eps = "none"') == 2
    assert kernel_lock.loads(lock.dumps(), emit_warnings=False).slots == lock.slots
    assert lock.factory("RMSNorm")(8).eps is None


def test_a_lock_written_before_keeps_its_number():
    lock = kernel_lock.loads(MINIMAL_LOCK, emit_warnings=False)
    assert lock.slots["RMSNorm"].kwargs["eps"] == 1e-6


def test_a_keyword_that_takes_no_none_refuses_it():
    text = MINIMAL_LOCK.replace("kwargs = { eps = 1e-6 }", 'kwargs = { eps = "none" }', 1)
    with pytest.raises(kernel_lock.errors.LockFormatError) as info:
        kernel_lock.loads(text, emit_warnings=False)  # the LayerNorm's: a number only
    assert info.value.key == "slots.LayerNorm.kwargs.eps"
    assert "'none' is a string, not a number" in info.value.problem


ACTIVATION = """
[slots.Activation]
implementation = "torch.gelu"
target = "torch.nn.GELU"
semantics = "activation"
function = "gelu-erf"
kwargs = { approximate = "none" }
"""


def test_a_string_choice_none_stays_a_string():
    lock = kernel_lock.loads(MINIMAL_LOCK + ACTIVATION, emit_warnings=False)
    assert lock.slots["Activation"].kwargs["approximate"] == "none"  # GELU's own spelling
    assert lock.factory("Activation")().approximate == "none"
