"""The lock format: canonical round trips and every malformed case we could think of."""

from __future__ import annotations

import json
import os
import re
import time
import warnings

import pytest

import kernel_lock
from kernel_lock import LockFormatError, LockVersionError, LockWarning, TargetNotAllowed
from tests.conftest import MINIMAL_LOCK, edited_lock, run_cli, write_sealed


def _replace(old: str, new: str) -> str:
    assert old in MINIMAL_LOCK, old
    return MINIMAL_LOCK.replace(old, new, 1)


# (name, text, error type, key path named in the error, words in the message)
MALFORMED = [
    ("not toml", "this is = = not toml", LockFormatError, None, "not valid TOML"),
    ("empty", "", LockFormatError, "lock-version", "required key is missing"),
    ("binary", b"\xff\xfe\x00garbage", LockFormatError, None, "not UTF-8"),
    ("future major", _replace('"1.0"', '"2.0"'), LockVersionError, "lock-version", "not supported"),
    (
        "bad version string",
        _replace('"1.0"', '"one"'),
        LockFormatError,
        "lock-version",
        "MAJOR.MINOR",
    ),
    (
        "version wrong type",
        _replace('"1.0"', "1.0"),
        LockFormatError,
        "lock-version",
        "expected string",
    ),
    (
        "missing created-by",
        _replace('created-by = "hand"\n', ""),
        LockFormatError,
        "created-by",
        "required",
    ),
    (
        "unknown slot",
        _replace("[slots.Linear]", "[slots.Layernorm]"),
        LockFormatError,
        "slots.Layernorm",
        "unknown slot",
    ),
    (
        "slot not a table",
        'lock-version = "1.0"\ncreated-by = "x"\nslots = { LayerNorm = 3 }\n',
        LockFormatError,
        "slots.LayerNorm",
        "expected a table",
    ),
    (
        "slots not a table",
        'lock-version = "1.0"\ncreated-by = "x"\nslots = [1]\n',
        LockFormatError,
        "slots",
        "expected table",
    ),
    (
        "missing target",
        _replace('target = "torch.nn.LayerNorm"\n', ""),
        LockFormatError,
        "slots.LayerNorm.target",
        "required",
    ),
    (
        "target wrong type",
        _replace('target = "torch.nn.LayerNorm"', "target = 3"),
        LockFormatError,
        "slots.LayerNorm.target",
        "expected string",
    ),
    (
        "target not dotted",
        _replace('target = "torch.nn.LayerNorm"', 'target = "LayerNorm"'),
        LockFormatError,
        "slots.LayerNorm.target",
        "dotted import path",
    ),
    (
        "os.system target",
        _replace('target = "torch.nn.LayerNorm"', 'target = "os.system"'),
        TargetNotAllowed,
        "slots.LayerNorm.target",
        "allow-list",
    ),
    (
        "lookalike root",
        _replace('target = "torch.nn.LayerNorm"', 'target = "torchvision.ops.Foo"'),
        TargetNotAllowed,
        "slots.LayerNorm.target",
        "allow-list",
    ),
    (
        "kernel_lock internals",
        _replace('target = "torch.nn.LayerNorm"', 'target = "kernel_lock.resolve.KernelFactory"'),
        TargetNotAllowed,
        "slots.LayerNorm.target",
        "allow-list",
    ),
    (
        "bad semantics",
        _replace('semantics = "layer_norm"', 'semantics = "rms_norm"'),
        LockFormatError,
        "slots.LayerNorm.semantics",
        "RMSNorm is not a LayerNorm",
    ),
    (
        "unknown semantics",
        _replace('semantics = "layer_norm"', 'semantics = "group_norm"'),
        LockFormatError,
        "slots.LayerNorm.semantics",
        "not one of",
    ),
    (
        "kwargs not a table",
        _replace("kwargs = { eps = 1e-6 }", "kwargs = 1"),
        LockFormatError,
        "slots.LayerNorm.kwargs",
        "expected table",
    ),
    (
        "kwarg nested table",
        _replace("kwargs = { eps = 1e-6 }", "kwargs = { eps = { a = 1 } }"),
        LockFormatError,
        "slots.LayerNorm.kwargs.eps",
        "constructor kwargs",
    ),
    (
        "env field not a table",
        _replace('device-type = { value = "cpu", match = "exact" }', 'device-type = "cpu"'),
        LockFormatError,
        "environment.device-type",
        "expected a table",
    ),
    (
        "env bad match rule",
        _replace('match = "exact"', 'match = "fuzzy"'),
        LockFormatError,
        "environment.device-type.match",
        "not one of",
    ),
    (
        "env wrong value type",
        _replace('value = "cpu"', "value = 1"),
        LockFormatError,
        "environment.device-type.value",
        "expected string",
    ),
    (
        "env value missing",
        _replace('value = "cpu", ', ""),
        LockFormatError,
        "environment.device-type.value",
        "required",
    ),
    (
        "bad requirement spec",
        _replace(
            "kwargs = { eps = 1e-6 }",
            'kwargs = { eps = 1e-6 }\nrequires = [{ name = "liger-kernel", specifier = "~~1" }]',
        ),
        LockFormatError,
        "slots.LayerNorm.requires[0].specifier",
        "PEP 440",
    ),
    (
        "requires not tables",
        _replace("kwargs = { eps = 1e-6 }", 'kwargs = { eps = 1e-6 }\nrequires = ["liger"]'),
        LockFormatError,
        "slots.LayerNorm.requires[0]",
        "expected table",
    ),
    (
        "bad digest",
        _replace('created-by = "hand"', 'created-by = "hand"\ndigest = "md5:abc"'),
        LockFormatError,
        "digest",
        "sha256",
    ),
    (
        "bad mode",
        _replace('created-by = "hand"', 'created-by = "hand"\nmode = "serving"'),
        LockFormatError,
        "mode",
        "not one of",
    ),
    (
        "bad precision",
        _replace('created-by = "hand"', 'created-by = "hand"\nprecision = "fp8"'),
        LockFormatError,
        "precision",
        "not one of",
    ),
    (
        "bool for string",
        _replace('created-by = "hand"', "created-by = true"),
        LockFormatError,
        "created-by",
        "boolean",
    ),
    (
        "datetime in evidence",
        _replace(
            "kwargs = { eps = 1e-6 }",
            "kwargs = { eps = 1e-6 }\nevidence = [{ when = 1979-05-27T07:32:00Z }]",
        ),
        LockFormatError,
        "slots.LayerNorm.evidence[0].when",
        "unsupported",
    ),
    (
        "twin not allowed",
        _replace(
            "kwargs = { eps = 1e-6 }",
            'kwargs = { eps = 1e-6 }\ntwin = { target = "subprocess.Popen" }',
        ),
        TargetNotAllowed,
        "slots.LayerNorm.twin.target",
        "allow-list",
    ),
    (
        "twin negative error",
        _replace(
            "kwargs = { eps = 1e-6 }",
            'kwargs = { eps = 1e-6 }\ntwin = { target = "torch.nn.LayerNorm", max-error = -1.0 }',
        ),
        LockFormatError,
        "slots.LayerNorm.twin.max-error",
        "non-negative",
    ),
    (
        "rejected bad status",
        _replace(
            "kwargs = { eps = 1e-6 }",
            'kwargs = { eps = 1e-6 }\nrejected = [{ implementation = "x", status = "meh" }]',
        ),
        LockFormatError,
        "slots.LayerNorm.rejected[0].status",
        "not one of",
    ),
    (
        "trusted module not a name",
        _replace('created-by = "hand"', 'created-by = "hand"\ntrusted-modules = ["a b"]'),
        LockFormatError,
        "trusted-modules[0]",
        "not a module name",
    ),
]


@pytest.mark.parametrize("name,text,error,key,words", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_locks(name, text, error, key, words):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        with pytest.raises(error) as exc:
            kernel_lock.loads(text, path="bad.toml")
    assert type(exc.value) is error, type(exc.value)  # the exact class, not only a subclass of it
    message = str(exc.value)
    assert message.startswith("bad.toml"), message  # the file is always named
    if key is not None:
        assert exc.value.key == key, message
        assert f"'{key}'" in message
    assert re.search(re.escape(words), message, re.I), message
    assert exc.value.exit_code == 5


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(LockFormatError, match="no such file") as exc:
        kernel_lock.load(tmp_path / "absent.toml")
    assert "kernel-probe --out" in str(exc.value)
    with pytest.raises(LockFormatError, match="is a directory"):
        kernel_lock.load(tmp_path)


def test_documented_example_is_a_valid_lock():
    from tests.conftest import ROOT

    doc = (ROOT / "docs" / "lock-format.md").read_text()
    block = doc.split("## Complete example", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        lock = kernel_lock.loads(block)
    assert set(lock.slots) == {"LayerNorm", "RMSNorm", "Linear"}
    assert lock.slots["RMSNorm"].requires[0].name == "liger-kernel"
    assert kernel_lock.loads(lock.sealed().dumps()).intact


# ---- requires[].module, private and __main__ targets, trust (hostile input, issue 14) ------------
@pytest.fixture
def canary(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "canarypkg"
    (pkg / "sub").mkdir(parents=True)
    flag = tmp_path / "canary-ran"
    (pkg / "__init__.py").write_text(f"open({str(flag)!r}, 'w').write('imported')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv(
        "PYTHONPATH", f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    return flag


REQUIRES = (
    'kwargs = {{ eps = 1e-6 }}\nrequires = [{{ name = "no-such-dist", module = "{module}" }}]'
)


@pytest.mark.parametrize("module", ["canarypkg.sub", "this.x", "nosuchpkg.sub"])
def test_requirement_modules_are_allow_listed_and_never_imported(
    tmp_path, capsys, canary, no_trust, module
):
    text = edited_lock(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module=module)})
    path = write_sealed(tmp_path / "k.toml", text, check_targets=False)
    code, out, err = run_cli(["verify", path, "--json"], capsys)
    assert code == 5 and "requirement module" in err and "allow-list" in err, err
    # --json: the error as JSON on stdout, nothing else
    assert json.loads(out)["error"]["exit_code"] == 5
    assert "Zen of Python" not in out + err and "Traceback" not in err
    assert not canary.exists()


def test_a_granted_requirement_module_is_looked_up_without_running_it(
    tmp_path, capsys, canary, no_trust
):
    path = write_sealed(
        tmp_path / "k.toml",
        edited_lock(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module="canarypkg.sub")}),
        check_targets=False,
    )
    code, out, err = run_cli(["verify", path, "--trust", "canarypkg"], capsys)
    assert code == 0, err  # found on the search path (a source tree), its package code never ran
    assert not canary.exists()
    path = write_sealed(
        tmp_path / "k.toml",
        edited_lock(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module="nosuchpkg.sub")}),
        check_targets=False,
    )
    code, out, err = run_cli(["verify", path, "--trust", "nosuchpkg"], capsys)
    assert code == 3 and "no-such-dist" in err and "not installed" in err and "Traceback" not in err


# ---- unvalidated values, huge and oversized locks (hostile input, issue 14) ----------------------
@pytest.mark.parametrize(
    "name,old,new,words",
    [
        ("5000-digit version", '"1.0"', '"' + "1" * 5000 + '.0"', "MAJOR.MINOR"),
        ("full-width digits", '"1.0"', '"\uff11.\uff10"', "MAJOR.MINOR"),
        ("trailing newline", '"1.0"', '"1.0\\n"', "MAJOR.MINOR"),
        ("eps nan", "kwargs = { eps = 1e-6 }", "kwargs = { eps = nan }", "not a finite number"),
        ("eps inf", "kwargs = { eps = 1e-6 }", "kwargs = { eps = inf }", "not a finite number"),
        (
            "int beyond 64 bits",
            "kwargs = { eps = 1e-6 }",
            "kwargs = { eps = 1e-6, n = 99999999999999999999 }",
            "beyond 64 bits",
        ),
        (
            "huge int in evidence",
            "kwargs = { eps = 1e-6 }",
            "kwargs = { eps = 1e-6 }\nevidence = [{ n = -99999999999999999999 }]",
            "beyond 64 bits",
        ),
    ],
)
def test_invalid_values_are_refused(name, old, new, words):
    assert old in MINIMAL_LOCK
    with pytest.raises(LockFormatError, match=words):
        kernel_lock.loads(MINIMAL_LOCK.replace(old, new, 1), emit_warnings=False)


@pytest.mark.slow
def test_many_unknown_keys_give_one_capped_list_of_warnings(tmp_path):
    extra = "".join(f"unknown{i} = {i}\n" for i in range(300_000))
    p = tmp_path / "k.toml"
    p.write_text(MINIMAL_LOCK.replace('created-by = "hand"\n', 'created-by = "hand"\n' + extra))
    start = time.perf_counter()
    lock = kernel_lock.load(p, emit_warnings=False)
    assert time.perf_counter() - start < 30
    assert len(lock.warnings) <= 22 and "and 299981 more warning(s)" in lock.warnings[-1]


def test_an_oversized_lock_is_refused(tmp_path):
    p = tmp_path / "k.toml"
    p.write_bytes(b"#" * (9 << 20))
    with pytest.raises(LockFormatError, match="more than the 8388608 this input may have"):
        kernel_lock.load(p)
