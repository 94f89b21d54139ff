"""kernel-probe explain: why a lock chose what it chose for one slot."""

from __future__ import annotations

from tests.conftest import run_cli as run


def test_explain_with_a_bad_slot_is_a_usage_error(lock_file, capsys):
    code, _, err = run(["explain", lock_file, "Layernorm"], capsys)
    assert code == 2 and "did you mean 'LayerNorm'" in err
    code, _, err = run(["explain", lock_file, "LayerNorm", "extra"], capsys)
    assert code == 2
