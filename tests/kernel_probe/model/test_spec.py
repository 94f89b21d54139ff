"""A model spec is read without torch: its three forms, and every bad one refused with exit 2,
naming the spec and the fix, before any child starts."""

from __future__ import annotations

import os

import pytest

from kernel_lock.errors import ExitCode
from kernel_probe.errors import UsageError
from kernel_probe.model import parse_spec
from tests.conftest import ROOT, run_cli

BLOCK = ROOT / "tests" / "models" / "block.py"


def test_a_file_spec_is_its_absolute_path_and_its_folder(monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = parse_spec("tests/models/block.py:build")
    assert (spec.kind, spec.source, spec.callable) == ("file", str(BLOCK), "build")
    assert spec.folder == str(BLOCK.parent)
    assert parse_spec(f"{BLOCK}:Block.build").callable == "Block.build"


def test_a_module_spec_and_an_anemoi_config():
    spec = parse_spec("tests.models.block:build")
    assert (spec.kind, spec.source, spec.folder) == ("module", "tests.models.block", None)
    named = parse_spec("anemoi:transformer")
    assert (named.kind, named.source) == ("anemoi", "transformer")


def test_an_anemoi_yaml_path_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text("model: {}\n")
    monkeypatch.chdir(tmp_path)
    assert parse_spec("anemoi:c.yaml").source == str(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    ("text", "said", "fix"),
    [
        ("tests/models/block.py", "no ':callable'", "after a colon"),
        ("block:", "'' is not a Python name", "name of a function"),
        ("tests/models/block.py:1build", "'1build' is not a Python name", "name of a function"),
        ("tests/models/block.py:build-it", "is not a Python name", "name of a function"),
        ("no/such/model.py:build", "does not exist", "path of the model's .py file"),
        ("README.md:build", "is not a .py file", "name a .py file"),
        ("tests/models:build", "is not a .py file", "name a .py file"),
        ("my-package.model:build", "neither a .py file nor a module name", "by dots"),
        ("pkg.class:build", "neither a .py file nor a module name", "by dots"),
        ("", "empty", "path/to/file.py:callable"),
        ("anemoi:", "no config", "anemoi:path/to/config.yaml"),
        ("anemoi:no/such.yaml", "is not a file", "existing YAML config"),
    ],
)
def test_a_bad_spec_is_a_usage_error_with_its_fix(text, said, fix, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(UsageError) as caught:
        parse_spec(text)
    assert caught.value.exit_code == ExitCode.USAGE == 2
    assert said in caught.value.problem and fix in (caught.value.fix or "")
    assert caught.value.problem.startswith(f"--model {text!r}")


def test_the_command_refuses_a_bad_spec_before_any_child(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    started = []
    monkeypatch.setattr(
        "kernel_probe.model.tracing.run_function", lambda *a, **k: started.append(a)
    )
    code, out, err = run_cli(["model", "tests/models/block.py"], capsys)
    assert code == 2 and "no ':callable'" in err and "fix:" in err and not started
    code, out, err = run_cli(["model", "tests/models/block.py:build", "--precision", "fp8"], capsys)
    assert code == 2 and "invalid choice" in err and not started


def test_the_spec_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, kernel_probe.model; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize(
    ("result", "code", "said"),
    [
        (
            dict(status="ok", value={"sites": [{"slot": 1}]}),
            1,
            "the trace's answer is not readable",
        ),
        (dict(status="ok", value=["sites"]), 1, "expected an object"),
        (
            dict(status="error", reason="KeyError: 'x'", raised={"raised": "KeyError"}),
            1,
            "the child tracing it failed: KeyError",
        ),
        (
            dict(status="error", raised={"raised": "ModelCodeError", "message": "build() raised"}),
            5,
            "build() raised",
        ),
    ],
)
def test_what_the_child_answers_is_read_by_the_locks_reader(result, code, said, monkeypatch):
    from kernel_probe.isolation.child import ChildResult
    from kernel_probe.model import trace

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(
        "kernel_probe.model.tracing.run_function", lambda *a, **k: ChildResult(**result)
    )
    with pytest.raises(Exception) as caught:
        trace("tests/models/block.py:build")
    assert caught.value.exit_code == code and said in caught.value.problem
