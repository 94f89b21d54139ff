"""The job-start check agrees with the import (issue 24, points 1 and 4).

For each sealed, hand-edited lock the issue lists, the warm paths -- ``verify(targets="static")``
(``verify --no-import``) and ``verify(targets="child")`` (``kernel-probe --out L`` reuse and
``--check``) -- refuse whatever plain ``verify`` / ``factory`` refuse, with the same exit code where
the facts are known without importing; a target only an import can judge is never "current".
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import kernel_lock
from kernel_lock import fingerprint, registry, slots, toml
from kernel_lock.errors import KernelUnavailable, LockError
from kernel_lock.resolve import factory
from kernel_lock.trust import locate
from tests.conftest import small_probe, write_sealed

CHECKED = (
    "python",
    "os",
    "arch",
    "torch",
    "torch-cuda",
    "device-type",
)  # this machine's, match exact


def _base() -> dict[str, Any]:
    now = fingerprint.current()
    env = {name: {"value": now[name], "match": "exact"} for name in CHECKED}
    entry = lambda impl, target, sem, kwargs: {  # noqa: E731
        "implementation": impl,
        "target": target,
        "semantics": sem,
        "kwargs": kwargs,
        "twin": {
            "target": target,
            "kwargs": kwargs,
            "state-dict": "interchangeable",
            "max-error": 0.0,
        },
    }
    return {
        "lock-version": "1.2",
        "created-by": "test",
        "environment": env,
        "slots": {
            "LayerNorm": entry(
                "torch.layer_norm", "torch.nn.LayerNorm", "layer_norm", {"eps": 1e-5, "bias": True}
            ),
            "RMSNorm": entry("torch.rms_norm", "torch.nn.RMSNorm", "rms_norm", {"eps": 1e-6}),
            "Linear": entry("torch.linear", "torch.nn.Linear", "linear", {"bias": True}),
        },
    }


def _ln(d):
    return d["slots"]["LayerNorm"]


def _set(slot: str, **values):
    def edit(d):
        d["slots"][slot].update(values)

    return edit


def _missing_files(d):
    _ln(d).update(
        target="kp_ghost.FastLayerNorm",
        requires=[{"name": "kp-ghost", "specifier": ">=1", "module": "kp_ghost"}],
    )


def _twin_alias(d):
    d["mode"] = "inference"
    _ln(d).update(devices=["no-such-device"])
    _ln(d)["twin"].update(target="torch.nn.modules.RMSNorm", kwargs={"eps": 1e-5})


CASES = {
    "LayerNorm slot -> torch.nn.RMSNorm": _set(
        "LayerNorm", target="torch.nn.RMSNorm", kwargs={"eps": 1e-5}
    ),
    "LayerNorm slot -> alias of RMSNorm": _set(
        "LayerNorm", target="torch.nn.modules.normalization.RMSNorm", kwargs={}
    ),
    "LayerNorm slot -> torch.nn.Identity": _set("LayerNorm", target="torch.nn.Identity", kwargs={}),
    "class missing from its module": _set("LayerNorm", target="torch.nn.NoSuchNorm"),
    "a function": _set("LayerNorm", target="torch.nn.functional.layer_norm", kwargs={}),
    "unknown constructor kwarg": _set("LayerNorm", kwargs={"eps": 1e-5, "frobnicate": 1}),
    "unknown kwarg through an alias": _set(
        "LayerNorm", target="torch.nn.modules.LayerNorm", kwargs={"frob": 1}
    ),
    "dist-info without module files": _missing_files,
    "inference twin through an alias": _twin_alias,
    # point 4: an int8 Linear followed by a ReLU, no trainable parameters; and a QAT Linear
    # (subclasses nn.Linear)
    "Linear slot -> quantized LinearReLU": _set(
        "Linear", target="torch.ao.nn.intrinsic.quantized.dynamic.LinearReLU", kwargs={}
    ),
    "Linear slot -> QAT Linear": _set("Linear", target="torch.ao.nn.qat.Linear", kwargs={}),
}
GOOD = {
    "as written": lambda d: None,
    "canonical name through an alias": _set(
        "LayerNorm", target="torch.nn.modules.normalization.LayerNorm"
    ),
    "compiled adapter": _set("RMSNorm", target="kernel_lock.adapters.CompiledRMSNorm"),
}


@pytest.fixture
def ghost_site(tmp_path, monkeypatch):
    """A distribution whose metadata says installed while its module files are gone."""
    site = tmp_path / "site"
    meta = site / "kp_ghost-1.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: kp-ghost\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("KERNEL_LOCK_TRUST", os.environ.get("KERNEL_LOCK_TRUST", "") + ",kp_ghost")
    return site


def _lock(tmp_path: Path, edit) -> Path:
    d = copy.deepcopy(_base())
    edit(d)
    path = tmp_path / "lock.toml"
    return write_sealed(path, toml.dumps(d))  # sealed, as `kernel-probe rehash` does


def _import_verdict(path: Path) -> int:
    """What plain `verify` decides: the machine, then every slot's class imported."""
    try:
        lock = kernel_lock.load(path, emit_warnings=False)
        lock.verify()
        for slot in kernel_lock.SLOTS:
            factory(lock, slot, verify_environment=False)
    except LockError as exc:
        return exc.exit_code
    return 0


def _warm_verdict(path: Path, targets: str) -> int:
    try:
        kernel_lock.load(path, emit_warnings=False).verify(targets=targets)
    except LockError as exc:
        return exc.exit_code
    return 0


class _ChildExited(Exception):
    pass


def _child_in_this_process(monkeypatch) -> list[list[str]]:
    """The confirming child of ``verify(targets="child")`` run in this process: the same
    ``confirm_child`` on the same JSON request, its stdout parsed by the same code, without
    starting an interpreter that imports torch (a second or more each). Returns the list of children
    asked for."""
    import contextlib
    import io
    import json

    from kernel_lock import launch

    started: list[list[str]] = []

    def run(argv, *, input, timeout):
        assert (
            argv[:2] == [sys.executable, "-I"]
            and "from kernel_lock.launch import confirm_child" in argv[-1]
        ), argv
        started.append(argv)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(_ChildExited):
            launch.confirm_child(json.loads(input), kernel_lock.loads, factory)  # os._exit(0)
        return subprocess.CompletedProcess(argv, 0, out.getvalue(), "")

    def exit_(code):
        raise _ChildExited(code)

    monkeypatch.setattr(launch, "run", run)
    monkeypatch.setattr(os, "_exit", exit_)
    return started


@pytest.mark.parametrize("case", CASES)
def test_the_warm_path_refuses_what_the_import_refuses(tmp_path, ghost_site, monkeypatch, case):
    """The verdicts agree (isolation is test_a_real_child_reaches_the_same_verdict's, below)."""
    _child_in_this_process(monkeypatch)
    path = _lock(tmp_path, CASES[case])
    refused = _import_verdict(path)
    assert refused != 0, "the case must be one the import path refuses"
    static, child = _warm_verdict(path, "static"), _warm_verdict(path, "child")
    assert static != 0 and child != 0
    assert child == refused  # the child's verdict is the import's own
    assert static in (
        refused,
        KernelUnavailable.exit_code,
    )  # known: the same; unknown: "not confirmed" (3)


@pytest.mark.slow  # a confirming child imports torch
def test_a_real_child_reaches_the_same_verdict(
    tmp_path, monkeypatch, case="Linear slot -> QAT Linear"
):
    """On a case only an import can judge, a real interpreter and the in-process child above say the
    same thing, word for word: the cases above lose nothing by not starting one each."""
    path = _lock(tmp_path, CASES[case])

    def verdict() -> str:
        with pytest.raises(LockError) as info:
            kernel_lock.load(path, emit_warnings=False).verify(targets="child")
        return f"{info.value.exit_code}: {info.value}"

    real = verdict()
    started = _child_in_this_process(monkeypatch)
    assert verdict() == real
    assert len(started) == 1  # the in-process child was asked, once


# ---- the static table is torch's own -------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [name for s in slots.SPECS.values() for name in (*s.known_targets, *s.aliases)],
)
def test_the_table_matches_the_installed_torch(name):
    import importlib
    import inspect

    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    facts = registry.target_facts(name)
    assert facts is not None and facts.complete
    assert slots.class_semantics(cls) == facts.semantics
    accepted = {
        n
        for n, p in inspect.signature(cls).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    assert accepted == set(facts.params)
    assert cls is getattr(
        importlib.import_module(slots.canonical_target(name).rpartition(".")[0]), attr
    )


def test_registry_targets_take_the_registry_semantics():
    for cand in registry.data()["candidate"]:
        facts = registry.target_facts(cand["target"])
        assert facts is not None and facts.semantics == slots.SPECS[cand["slots"][0]].semantics
        assert set(cand.get("kwargs", {})) <= facts.params


# ---- point 4: semantics by class -----------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, expected",
    [
        (torch.nn.LayerNorm, "layer_norm"),
        (torch.nn.RMSNorm, "rms_norm"),
        (torch.nn.Linear, "linear"),
        (torch.nn.LazyLinear, "linear"),
        (torch.nn.modules.linear.NonDynamicallyQuantizableLinear, "linear"),
        (torch.nn.Bilinear, "other: Bilinear"),
        (torch.nn.Identity, "other: Identity"),
        (torch.ao.nn.intrinsic.quantized.dynamic.LinearReLU, "other"),
        (torch.ao.nn.quantized.dynamic.Linear, "other"),
        (torch.ao.nn.quantized.Linear, "other"),
        (torch.ao.nn.qat.Linear, "other"),  # subclasses nn.Linear, fake-quantises its weight
        (torch.ao.nn.intrinsic.LinearReLU, "other"),
    ],
)
def test_semantics_follow_the_class_hierarchy(cls, expected):
    assert (slots.class_semantics(cls) or "").startswith(expected)


def test_a_name_says_nothing():
    class FastLinearGELU(torch.nn.Module):  # a Linear by name only
        pass

    class MyRMSNorm(torch.nn.Module):
        pass

    FastLinearGELU.__module__ = MyRMSNorm.__module__ = "mylib.layers"
    assert (
        slots.class_semantics(FastLinearGELU) is None and slots.class_semantics(MyRMSNorm) is None
    )
    assert registry.declared_semantics("liger_kernel.transformers.LigerRMSNorm") == "rms_norm"


def test_strict_verify_refuses_linear_relu(tmp_path, capsys):
    from tests.conftest import run_cli

    path = _lock(tmp_path, CASES["Linear slot -> quantized LinearReLU"])
    code, _, err = run_cli(["verify", "--strict", path], capsys)
    assert code == 5 and "not linear" in err


# ---- find_spec without importing the parent ------------------------------------------------------
def test_locate_runs_no_package_code(tmp_path, monkeypatch):
    pkg = tmp_path / "kp_locate_probe"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate("kp_locate_probe.sub") is True
    # only an import could tell: unknown, not missing
    assert locate("kp_locate_probe.missing") is None
    assert locate("kp_no_such_top_level") is False
    assert "kp_locate_probe" not in sys.modules


# ---- the command line, on a lock written by a real probe -----------------------------------------
@pytest.mark.slow
def test_check_and_no_import_on_the_command_line(tmp_path, ghost_site):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ghost_site), os.environ.get("PYTHONPATH", "")])
    )
    env["KERNEL_LOCK_TRUST"] += ",kp_ghost"
    shapes = small_probe(reps=1, precision=None)

    def kp(*argv):
        proc = subprocess.run(
            [sys.executable, "-m", "kernel_probe", *map(str, argv)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return proc.returncode, proc.stdout + proc.stderr

    rc, out = kp("--out", "k.toml", *shapes)
    assert rc == 0, out
    base = toml.loads((tmp_path / "k.toml").read_text())
    for name in (
        "LayerNorm slot -> torch.nn.Identity",
        "unknown constructor kwarg",
        "dist-info without module files",
    ):
        d = copy.deepcopy(base)
        d["environment"] = base["environment"]
        CASES[name](d)
        path = tmp_path / "case.toml"
        path.write_text(toml.dumps(d))
        # a hand edit: the digest differs, which plain verify only warns about
        refused, _ = kp("verify", path)
        assert refused != 0
        before = path.read_text()
        sealed, out = kp("rehash", path)  # rehash seals only what no import would refuse
        if name == "dist-info without module files":  # absent here, not wrong: sealed, and said
            assert sealed == 0 and "slots.LayerNorm: kp_ghost.FastLayerNorm not judged" in out, out
        else:
            assert sealed == refused and path.read_text() == before, out  # refused, nothing written
            write_sealed(path, toml.dumps(d))  # sealed regardless, for the job-start checks below
        for argv in (["--out", path, "--check", *shapes], ["verify", path, "--no-import"]):
            rc, out = kp(*argv)
            assert rc not in (0, 1), (name, argv, out)
