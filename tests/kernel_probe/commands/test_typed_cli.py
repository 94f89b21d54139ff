"""Issue 52, typed values at the command line: numbers that are not finite render (strict JSON,
no crash), and an option out of its declared range is refused before any work (exit 2)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MINIMAL_LOCK, run_cli, write_sealed

NOT_FINITE = (
    MINIMAL_LOCK
    + """
[[slots.Linear.evidence]]
device = "cpu"
worst-error-ratio = nan
error-ratios = { out = inf, dx = -inf }

[[slots.Linear.timing]]
implementation = "torch.linear"
shape = "64x32"
dtype = "float32"
regime = "true"
median-ms = inf

[[slots.Linear.timing]]
implementation = "torch.compile.linear"
shape = "64x32"
dtype = "float32"
regime = "true"
median-ms = 1.5
"""
)


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_show_json_writes_what_is_not_a_number_as_toml_spells_it(tmp_path, capsys):
    path = write_sealed(tmp_path / "k.toml", NOT_FINITE)
    code, out, _ = run_cli(["show", path, "--json"], capsys)
    assert code == 0
    evidence = _strict(out)["slots"]["Linear"]["evidence"][0]
    assert evidence["worst-error-ratio"] == "nan"
    assert evidence["error-ratios"] == {"out": "inf", "dx": "-inf"}


def test_explain_renders_a_time_that_is_not_finite(tmp_path, capsys):
    path = write_sealed(tmp_path / "k.toml", NOT_FINITE)
    code, out, err = run_cli(["explain", path, "Linear"], capsys)
    assert code == 0, err
    assert "inf" in out and "torch.compile.linear" in out


@pytest.mark.parametrize(
    "option", ["window=18446744073709551616", "dropout=nan", "softcap=inf", "alibi=yes"]
)
def test_an_attention_option_out_of_range_is_refused_before_any_work(
    option, tmp_path, capsys, no_workers
):
    argv = ["--out", tmp_path / "k.toml", "--slot", "Attention", "--attention", f"4x8x16:{option}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and option.split("=")[0] + " must be" in err
    assert not (tmp_path / "k.toml").exists()
