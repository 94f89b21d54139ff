"""kernel-probe show: a lock in readable form, and as JSON."""

from __future__ import annotations

import json

from tests.conftest import run_cli as run


def test_show_text_and_json(lock_file, capsys):
    code, out, _ = run(["show", str(lock_file)], capsys)
    assert code == 0 and "LayerNorm" in out and "torch.layer_norm" in out
    code, out, _ = run(["show", str(lock_file), "--json"], capsys)
    assert json.loads(out)["slots"]["LayerNorm"]["kwargs"] == {"eps": 1e-6}
