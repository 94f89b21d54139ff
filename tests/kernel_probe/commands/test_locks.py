"""kernel_probe/commands/locks.py: show (a lock in readable form, and as JSON); explain (why a lock
chose what it chose for one slot, with a text bar chart of the candidates' times per shape within 80
columns, issue 37); diff (what changed between two locks, and exit 6 with --exit-code when they
differ). verify, rehash and lock --for inference: test_verify.py, test_rehash.py, test_lock.py."""

from __future__ import annotations

import json
import subprocess
import sys

from kernel_probe.commands.locks import bar_chart
from tests.conftest import MINIMAL_LOCK, ROOT, write_sealed
from tests.conftest import run_cli as run


# ---- show ----------------------------------------------------------------------------------------
def test_show_text_and_json(lock_file, capsys):
    code, out, _ = run(["show", str(lock_file)], capsys)
    assert code == 0 and "LayerNorm" in out and "torch.layer_norm" in out
    code, out, _ = run(["show", str(lock_file), "--json"], capsys)
    assert json.loads(out)["slots"]["LayerNorm"]["kwargs"] == {"eps": 1e-6}


# ---- explain -------------------------------------------------------------------------------------
def test_explain_with_a_bad_slot_is_a_usage_error(lock_file, capsys):
    code, _, err = run(["explain", lock_file, "Layernorm"], capsys)
    assert code == 2 and "did you mean 'LayerNorm'" in err
    code, _, err = run(["explain", lock_file, "LayerNorm", "extra"], capsys)
    assert code == 2


ROWS = [
    {
        "implementation": "torch.layer_norm",
        "shape": "2048x1024",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 2.0,
    },
    {
        "implementation": "liger.layer_norm",
        "shape": "2048x1024",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 1.0,
    },
    {
        "implementation": "torch.layer_norm",
        "shape": "8x8",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 0.01,
    },
    {
        "implementation": "te.layer_norm",
        "shape": "8x8",
        "dtype": "float32",
        "regime": "true",
        "error": "OOM",
    },
]


def test_bars_are_scaled_to_the_slowest_at_each_shape_and_mark_the_chosen():
    lines = bar_chart(ROWS, chosen="liger.layer_norm")
    assert all(len(line) <= 80 for line in lines)
    group = lines[lines.index("  2048x1024 fp32 true") + 1 :][:2]
    fast, slow = group  # fastest first
    assert fast.lstrip().startswith("* liger.layer_norm") and slow.lstrip().startswith(
        "torch.layer_norm"
    )
    assert fast.count("#") * 2 == slow.count("#") or abs(fast.count("#") * 2 - slow.count("#")) <= 1
    assert fast.endswith(" 1") and slow.endswith(" 2")
    assert not any("te.layer_norm" in line for line in lines)  # a row without a time draws no bar


def test_no_timings_no_chart():
    assert bar_chart([], chosen="x") == [] and bar_chart([ROWS[3]]) == []


# ---- diff ----------------------------------------------------------------------------------------
def test_diff_exit_code_is_6_when_the_locks_differ(tmp_path, capsys):
    from kernel_lock.errors import EXIT_CODES

    a, same, b = tmp_path / "a.toml", tmp_path / "same.toml", tmp_path / "b.toml"
    for path, text in (
        (a, MINIMAL_LOCK),
        (same, MINIMAL_LOCK),
        (b, MINIMAL_LOCK.replace("bias = false", "bias = true")),
    ):
        write_sealed(path, text)
    code, out, _ = run(["diff", a, b, "--exit-code"], capsys)
    assert code == 6 and "diff --exit-code" in EXIT_CODES[6]
    assert "slot Linear kwargs: {'bias': False} -> {'bias': True}" in out
    assert run(["diff", a, b], capsys)[0] == 0  # without --exit-code a difference is not a status
    assert run(["diff", a, same, "--exit-code"], capsys)[0] == 0
    assert run(["diff", a, a, "--exit-code"], capsys)[0] == 0
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", "diff", str(a), str(b), "--exit-code"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 6, proc.stderr
    code, out, _ = run(["diff", "--help"], capsys)
    assert code == 0 and "exit 6 when the locks differ" in " ".join(out.split())


# ---- one answer per question (issue 57) ---------------------------------------------------------
def _locks_of_every_slot(tmp_path):
    """Two locks that between them pin every built-in slot and leave every one unpinned: the
    checked-in lock of RMSNorm, Attention, GatedMLP and Activation (its environment cut to this
    CPU), and MINIMAL_LOCK's LayerNorm and Linear."""
    every = (ROOT / "tests/kernel_lock/data/locks/build-lock-every-slot.toml").read_text()
    head = 'lock-version = "1.3"\ncreated-by = "hand"\nmode = "training"\n\n'
    env = '[environment]\ndevice-type = { value = "cpu", match = "exact" }\n\n'
    every = head + env + every[every.index("[slots.") :]
    rms = MINIMAL_LOCK.index("[slots.RMSNorm]")
    rest = MINIMAL_LOCK[:rms] + MINIMAL_LOCK[MINIMAL_LOCK.index("[slots.Linear]") :]
    return [write_sealed(tmp_path / "every.toml", every), write_sealed(tmp_path / "min.toml", rest)]


def test_explain_show_verify_and_their_json_agree_on_what_each_slot_resolves_to(tmp_path, capsys):
    """`explain LOCK SLOT`, `show`, `verify` and each one's --json give one answer per slot: the
    pinned class, or the slot's own default (GatedMLP: kernel_lock.gated_mlp.GatedMLP, never
    "torch.nn")."""
    import re

    import kernel_lock
    from kernel_lock.resolve import UNPINNED
    from kernel_lock.slots import SPECS

    seen_pinned, seen_unpinned = set(), set()
    for path in _locks_of_every_slot(tmp_path):
        lock = kernel_lock.load(path, emit_warnings=False)
        code, out, err = run(["verify", path, "--json"], capsys)
        assert code == 0, err
        answer = {
            s: (r["implementation"], r["target"], r["kwargs"])
            for s, r in json.loads(out)["slots"].items()
        }
        assert set(answer) == set(kernel_lock.SLOTS)
        _, shown, _ = run(["show", path, "--json"], capsys)
        _, verified, _ = run(["verify", path], capsys)
        _, table, _ = run(["show", path], capsys)
        for slot, (implementation, target, kwargs) in answer.items():
            pinned = slot in lock.slots
            (seen_pinned if pinned else seen_unpinned).add(slot)
            assert (implementation == UNPINNED) != pinned
            assert target == (lock.slots[slot].target if pinned else SPECS[slot].default_target)
            assert json.loads(shown)["resolves-to"][slot] == {
                "implementation": implementation,
                "target": target,
                "kwargs": kwargs,
            }
            code, explained, _ = run(["explain", path, slot, "--json"], capsys)
            assert (
                code == 0
                and json.loads(explained)["resolves-to"] == json.loads(shown)["resolves-to"][slot]
            )
            code, explained, _ = run(["explain", path, slot], capsys)
            words = " ".join(explained.split())
            said = f"{slot} -> {implementation} ({target})" if pinned else f"resolves to {target},"
            assert code == 0 and said in words, words
            assert f"  {slot:<10} -> {target} {kwargs}" in verified
            row = rf"^\s*{slot}\s+{re.escape(implementation)}\s+{re.escape(target)}\s"
            assert re.search(row, table, re.M), table
    assert seen_pinned == seen_unpinned == set(kernel_lock.SLOTS)


def test_explain_shows_the_paired_ratio_its_interval_and_the_load(capsys, monkeypatch):
    """Issue 56: the interval written in the lock (1.4) is shown by explain, with the load seen."""
    monkeypatch.setenv("COLUMNS", "160")
    lock = ROOT / "tests" / "kernel_lock" / "data" / "locks" / "build-lock-fixed-reports.toml"
    code, out, _ = run(["explain", str(lock), "LayerNorm"], capsys)
    assert code == 0, out
    assert "0.91 [0.82, 1.00] x7" in out and "1.2 / 1" in out
    assert "the median time ratio of the paired rounds" in out
