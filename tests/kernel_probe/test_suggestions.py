"""Every misspelt option, choice, slot name or subcommand is met with the nearest right one,
case-insensitively, by one helper (``kernel_lock.tables.nearest``), and no option is taken for its
abbreviation (issue 57, point 6). Before: ``--precison bf16`` printed 18 lines of usage and no
suggestion, ``--shap`` was silently taken for ``--shape``, ``explain LOCK LayerNrom`` and
``lock.factory("LayerNrom")`` suggested nothing."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from kernel_lock.tables import did_you_mean, nearest
from kernel_probe import cli
from tests.conftest import run_cli, write_sealed

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "word,known,near",
    [
        ("layernorm", ["LayerNorm", "RMSNorm"], "LayerNorm"),  # a case, however far the letters
        ("LayerNrom", ["LayerNorm", "RMSNorm"], "LayerNorm"),
        ("--PRECISON", ["--precision", "--shape"], "--precision"),
        ("Inference", ["training", "inference"], "inference"),
        ("Dense", ["LayerNorm", "RMSNorm", "Linear"], None),
    ],
)
def test_nearest_is_case_insensitive_and_says_none_when_none_is_near(word, known, near):
    assert nearest(word, known) == near
    assert did_you_mean(word, known) == (
        f"did you mean {near!r}?" if near else f"known: {', '.join(known)}"
    )


# (the command line, what the fix says); {k} is a lock
MISTAKES = [
    (["--precison", "bf16-mixed"], "--precison: did you mean '--precision'?"),
    (["--Precision", "bf16-mixed"], "did you mean '--precision'?"),
    (["--shap", "64x32"], "--shap: did you mean '--shape'?"),
    (["--shape=64x32", "--chek"], "--chek: did you mean '--check'?"),
    (["--slot", "layernorm"], "did you mean 'LayerNorm'? slot names are case-sensitive"),
    (["--slot", "LayerNrom"], "did you mean 'LayerNorm'?"),
    (["--pin", "layernorm=torch.layer_norm"], "did you mean 'LayerNorm'?"),
    (["--pin", "LayerNorm=torch.layer_nrm"], "did you mean 'torch.layer_norm'?"),
    (["check", "--dtyp", "bf16"], "--dtyp: did you mean '--dtype'?"),
    (["check", "--slot", "RMSnorm"], "did you mean 'RMSNorm'?"),
    (["explain", "{k}", "LayerNrom"], "did you mean 'LayerNorm'?"),
    (["explain", "{k}", "layernorm"], "did you mean 'LayerNorm'?"),
    (["show", "{k}", "--jsn"], "--jsn: did you mean '--json'?"),
    (["verify", "{k}", "--mode", "Inference"], "did you mean 'inference'?"),
    (["profiles", "lst"], "did you mean 'list'?"),
    (["profiles", "show", "cpu", "--jsno"], "--jsno: did you mean '--json'?"),
    (["Verify", "{k}"], "did you mean 'verify'?"),
    (["expalin", "{k}"], "did you mean 'explain'?"),
]


@pytest.mark.parametrize("argv,fix", MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_a_mistake_gets_the_nearest_and_no_usage(argv, fix, tmp_path, capsys, no_workers):
    argv = [a.format(k=write_sealed(tmp_path / "k.toml")) for a in argv]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and fix in err, err
    assert "usage:" not in err and not out  # a message and its fix, not the whole usage
    code, out, _ = run_cli([*argv, "--json"], capsys)
    assert code == 2 and fix in json.loads(out)["error"]["fix"]


def test_no_option_is_taken_for_its_abbreviation(tmp_path, capsys, no_workers):
    code, _, err = run_cli(["--shap", "64x32", "--check", "--out", tmp_path / "k.toml"], capsys)
    assert code == 2 and "unrecognized arguments: --shap 64x32" in err
    parsers = [cli._probe_parser([])[0], *(cli.build_subparser(n)[0] for n in cli.SUBCOMMANDS)]
    for parser in parsers:
        subs = [a.choices for a in parser._actions if isinstance(a.choices, dict)]
        for p in [parser, *(sub for choices in subs for sub in choices.values())]:
            assert p.allow_abbrev is False, p.prog


def test_every_parser_the_project_builds_refuses_abbreviations():
    """The CLI, the docs generator, the benchmarks and the GPU kit: each ``ArgumentParser(...)``
    and ``add_parser(...)`` says ``allow_abbrev=False``."""
    files = [
        *(ROOT / "kernel_probe").rglob("*.py"),
        *(ROOT / "kernel_lock").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        ROOT / "tests" / "gpu_suite.py",
    ]
    found, allowing = 0, []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(getattr(node, "func", None), "attr", None)
            if isinstance(node, ast.Call) and name in ("ArgumentParser", "add_parser"):
                found += 1
                off = [k for k in node.keywords if k.arg == "allow_abbrev"]
                if not (
                    off and isinstance(off[0].value, ast.Constant) and off[0].value.value is False
                ):
                    allowing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found >= 15 and not allowing, allowing


def test_the_python_api_names_the_nearest_slot(tmp_path):
    import kernel_lock
    from kernel_lock.errors import LockFormatError

    lock = kernel_lock.load(write_sealed(tmp_path / "k.toml"))
    for wrong in ("layernorm", "LayerNrom"):
        with pytest.raises(LockFormatError) as exc:
            lock.factory(wrong)
        assert "did you mean 'LayerNorm'?" in str(exc.value)
