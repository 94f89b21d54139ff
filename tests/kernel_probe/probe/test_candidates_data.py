"""The built-in candidates are data, read by the one candidate parser, and each slot fact has one
home.

``kernel_lock/registry.toml`` declares the built-ins in a site profile's ``[[candidate]]`` form and
the libraries in ``[[library]]`` tables; the import allow-list
(``kernel_lock.registry.allowed_roots``) is derived from the candidates, and
``kernel_probe.detect.libraries`` reads the libraries, so adding a kernel library's candidate is one
data entry.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import registry, slots, toml
from kernel_lock.errors import TargetNotAllowed
from kernel_lock.trust import check_target
from kernel_probe import candidates as cands
from kernel_probe import profiles
from kernel_probe.probe import write as lockwrite
from kernel_probe.probe.check import check_all, dtype_plan
from kernel_probe.probe.choose import Choice
from kernel_probe.probe.report import Report
from kernel_probe.tables import CandidateDataError, TableReader
from tests.conftest import ROOT

BUILTIN_IDS = [c.id for c in cands.builtin()]


# ---- one home per slot fact ----------------------------------------------------------------------
def test_every_slot_fact_is_imported_from_kernel_lock_slots():
    from kernel_lock import document, resolve, schema
    from kernel_probe.commands import anemoi, locks
    from kernel_probe.probe import judge, report, tolerance

    assert kernel_lock.SLOTS is slots.SLOTS
    # every slot's facts are its SlotSpec's, read from the one registry
    assert (
        document.SPECS
        is resolve.SPECS
        is cands.SPECS
        is report.SPECS
        is lockwrite.SPECS
        is slots.SPECS
    )
    assert document.MODES is resolve.MODES is anemoi.MODES is locks.MODES is slots.MODES
    assert document.PRECISIONS is profiles.PRECISIONS is slots.PRECISIONS
    assert schema.STATUSES is judge.STATUSES is slots.STATUSES
    assert judge.confusable is slots.confusable and tolerance.DTYPES is slots.DTYPES


def test_precisions_are_names_to_dtype_and_regime():
    assert list(slots.PRECISIONS) == ["32-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed"]
    assert (
        slots.PRECISIONS["bf16-mixed"] == ("bfloat16", "mixed")
        and slots.PRECISIONS["16-true"].dtype == "float16"
    )
    with pytest.raises(TypeError):
        slots.PRECISIONS["fp8"] = ("float8", "true")  # type: ignore[index]


def test_the_slot_facts_agree_with_each_other():
    assert tuple(slots.SPECS) == slots.SLOTS and all(n == s.name for n, s in slots.SPECS.items())
    assert len(set(slots.semantics())) == len(slots.SPECS)
    for spec in slots.SPECS.values():
        assert slots.twin_semantics(spec.default_target) == spec.semantics
        assert not spec.confusable or spec.confusable in slots.semantics()


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("Layernorm", "did you mean 'LayerNorm'? slot names are case-sensitive"),
        ("rmsnorm", "did you mean 'RMSNorm'? slot names are case-sensitive"),
        ("Conv", "known slots: LayerNorm, RMSNorm, Linear, Attention, GatedMLP, Activation"),
        (  # issue 57: a misspelling, not only a case, names the nearest slot
            "LayerNrom",
            "did you mean 'LayerNorm'? known slots: LayerNorm, RMSNorm, Linear, Attention, "
            "GatedMLP, Activation",
        ),
    ],
)
def test_one_hint_for_a_misspelt_slot(name, fix):
    from kernel_lock.errors import LockFormatError
    from kernel_lock.resolve import factory
    from kernel_probe.commands.locks import slot_argument
    from kernel_probe.errors import UsageError

    assert slots.slot_name_fix(name) == fix
    with pytest.raises(LockFormatError) as exc:
        factory(None, name)
    assert exc.value.fix == fix
    with pytest.raises(UsageError) as exc:
        slot_argument(name)
    assert exc.value.fix == fix
    with pytest.raises(UsageError, match=fix.split("?")[0]):
        cands.from_command_line(f"{name}=mylib.Fast")


# ---- the built-ins are package data in the profile's [[candidate]] form --------------------------
def test_the_registry_is_package_data_of_kernel_lock():
    path = registry.path()
    assert path.parent == Path(kernel_lock.__file__).parent and path.name == registry.DATA
    package_data = toml.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    assert registry.DATA in package_data["kernel_lock"]
    assert cands.load_candidates(path) == cands.builtin() and all(
        c.source == "builtin" for c in cands.builtin()
    )


def test_the_library_table_is_read_from_the_registry():
    from kernel_probe.detect.libraries import known_libraries

    names = [lib.name for lib in known_libraries()]
    assert names == [lib["name"] for lib in registry.data()["library"]]
    assert names == [
        "liger-kernel",
        "transformer-engine",
        "apex",
        "flash-attn",
        "flash-attn-3",
        "quack-kernels",
        "kernels",
    ]
    apex = known_libraries()[names.index("apex")]
    assert [v.key for v in apex.variants] == [
        "rocm-fork",
        "nvidia",
        "unrelated",
    ] and not apex.variants[-1].usable
    assert apex.variants[0].text_in == (("git_version_info.py", "ROCm Apex"),)


def test_a_broken_library_table_names_the_key(tmp_path):
    from kernel_probe.detect.libraries import read_libraries

    r = TableReader("registry.toml")
    with pytest.raises(CandidateDataError) as exc:
        read_libraries(
            r, {"library": [{"name": "x", "module": "x", "check": "x", "variant": [{"key": "k"}]}]}
        )
    assert exc.value.key == "library[0].variant[0].label" and "missing" in str(exc.value)
    with pytest.raises(CandidateDataError) as exc:
        read_libraries(r, {"library": [{"name": "x", "modul": "x"}]})
    assert exc.value.key == "library[0].modul" and exc.value.fix == "did you mean 'module'?"


def test_a_builtin_entry_is_a_valid_profile_candidate(tmp_path):
    """The same parser reads both: a built-in's table, renamed, is accepted in a site profile."""
    data = registry.path().read_text()
    te = (
        data[data.index('id = "te.layer_norm"') :]
        .split("\n\n")[0]
        .replace('"te.layer_norm"', '"site.te_layer_norm"')
    )
    text = f'profile-version = "1"\nname = "site"\n\n[[candidate]]\n{te}\n'
    prof = profiles.parse(text, "site.toml")
    builtin = next(c for c in cands.builtin() if c.id == "te.layer_norm")
    assert prof.candidates[0].to_json() == {
        **builtin.to_json(),
        "id": "site.te_layer_norm",
        "source": "profile:site",
    }


@pytest.mark.parametrize(
    ("entry", "key", "problem"),
    [
        (
            'id = "x.ln"\nslots = ["LayerNorm"]\ntarget = "x.LN"\ncompiled = "yes"',
            "candidate[0].compiled",
            "true or false",
        ),
        (
            'id = "x.ln"\nslots = ["LayerNorm"]\ntarget = "x.LN"\nbuild-kwargs = { device = [1] }',
            "candidate[0].build-kwargs.device",
            "expected a string",
        ),
        (
            'id = "x.ln"\nslots = ["LayerNorm"]\ntarget = "x.LN"\ntwin_target = '
            '"torch.nn.LayerNorm"',
            "candidate[0].twin_target",
            "unknown key",
        ),
        (
            (
                'id = "torch.layer_norm"\nslots = ["LayerNorm"]\ntarget = '
                '"x.LN"\n\n[[candidate]]\nid = "torch.layer_norm"\nslots = ["LayerNorm"]\ntarget '
                '= "x.LN"'
            ),
            "candidate[1].id",
            "declared twice",
        ),
    ],
)
def test_a_broken_data_file_names_the_key(tmp_path, entry, key, problem):
    path = tmp_path / "candidates.toml"
    path.write_text(f"[[candidate]]\n{entry}\n")
    with pytest.raises(CandidateDataError) as exc:
        cands.load_candidates(path)
    assert exc.value.key == key and problem in str(exc.value)


# ---- the allow-list is derived from the registry; the library table is read from it --------------
@pytest.mark.parametrize("cid", BUILTIN_IDS)
def test_the_allow_list_accepts_every_builtin_target_and_twin(cid):
    cand = next(c for c in cands.builtin() if c.id == cid)
    # raises TargetNotAllowed when the allow-list lacks the candidate's library
    check_target(cand.target)
    check_target(cand.twin_target)


def test_the_allow_list_is_the_registrys_roots_and_nothing_else():
    used = {c.target for c in cands.builtin()} | {c.twin_target for c in cands.builtin()}
    assert registry.allowed_roots() == (
        "torch",
        "kernel_lock.adapters",
        "kernel_lock.attention",
        "kernel_lock.gated_mlp",
        "liger_kernel",
        "transformer_engine",
        "apex",
        "flash_attn",
        "quack",
    )
    for root in registry.allowed_roots():
        assert any(t == root or t.startswith(root + ".") for t in used), (
            f"{root} allowed but no candidate uses it"
        )
    check_target("kernel_lock.adapters.CompiledLayerNorm")
    with pytest.raises(TargetNotAllowed, match="kernel_lock.resolve"):
        # kernel_lock itself: only its adapters build classes
        check_target("kernel_lock.resolve.factory")
    with pytest.raises(TargetNotAllowed, match="kernels.Fast"):
        # a known library without candidates: detected, never imported from a lock
        check_target("kernels.Fast")


def test_detect_knows_every_builtin_library():
    from kernel_probe.detect.libraries import known_libraries

    by_module = {lib.module: lib for lib in known_libraries()}
    for cand in cands.builtin():
        if not cand.module:
            continue  # ships with torch
        lib = by_module.get(cand.module.split(".")[0])
        assert lib is not None, f"{cand.id}: no known_libraries() row for module {cand.module}"
        assert not cand.distribution or cand.distribution in lib.distributions, cand.id


@functools.cache
def _here() -> dict:
    from kernel_lock import fingerprint

    return dict(fingerprint.current())


def _lock_pinning(cand: cands.Candidate) -> kernel_lock.KernelLock:
    """The lock kernel_probe.probe.write writes when ``cand`` is chosen for its slot (no
    measurements)."""
    slot = cand.slots[0]
    report = Report(
        cand.id,
        cand.target,
        slot,
        cand.semantics,
        "cpu",
        "accepted",
        candidate=cand,
        source=cand.source,
    )
    choice = Choice(slot, report, "pinned", "pinned for this test")
    # the model's declaration is what the candidate computes (an Activation's function): a lock
    # declaring another is refused (issue 52)
    spec = slots.SPECS[slot]
    known = spec.computes(cand.target, cand.kwargs, None) if spec.computes else None
    canonical = {  # a "$name" placeholder is the canonical value itself
        slot: {
            k: v
            for k, v in (known or {}).items()
            if k in spec.canonical and not (isinstance(v, str) and v.startswith("$"))
        }
    }
    return lockwrite.build_lock(
        {slot: choice}, {slot: [report]}, {}, _here(), precision="32-true", canonical=canonical
    )


@pytest.mark.parametrize("cid", BUILTIN_IDS)
def test_a_lock_pinning_each_builtin_loads(cid):
    cand = next(c for c in cands.builtin() if c.id == cid)
    lock = kernel_lock.loads(_lock_pinning(cand).dumps(), emit_warnings=False)
    entry = lock.slots[cand.slots[0]]
    assert (entry.implementation, entry.target, entry.devices) == (
        cand.id,
        cand.target,
        cand.devices,
    )
    assert lock.trusted_modules == ()  # a built-in needs no trust


# ---- adding a kernel library is one data entry ---------------------------------------------------
FASTLIB_ENTRY = """
# a new kernel library: its LayerNorm takes the size as hidden_size
[[candidate]]
id = "fastlib.layer_norm"
slots = ["LayerNorm"]
target = "kp_fastlib.FastLayerNorm"
args = ["$hidden"]
kwargs = { eps = "$eps", bias = "$bias" }
distribution = "kp-fastlib"
twin-target = "torch.nn.LayerNorm"
twin-kwargs = { eps = "$eps", elementwise_affine = true, bias = "$bias" }
note = "a fake library from tests/fakes"
"""


@pytest.fixture
def with_fastlib(tmp_path, monkeypatch) -> cands.Candidate:
    data = tmp_path / registry.DATA
    shutil.copy(registry.path(), data)
    with data.open("a") as f:
        f.write(FASTLIB_ENTRY)
    # what shipping that file does: the registry is read from it, and kernel-probe's built-ins with
    # it
    monkeypatch.setattr(registry, "PATH", data)
    registry.reset()
    fastlib = cands.load_candidates(registry.path())
    monkeypatch.setattr(cands, "builtin", lambda: fastlib)
    yield fastlib[-1]
    monkeypatch.undo()
    registry.reset()


def test_a_new_library_entry_is_registered(with_fastlib):
    found, problems = cands.registry(entry_points=False)
    assert not problems and [c.id for c in found] == [*BUILTIN_IDS, "fastlib.layer_norm"]
    # the slot's, the target's
    assert with_fastlib.semantics == "layer_norm" and with_fastlib.module == "kp_fastlib"
    assert with_fastlib.install_hint("cuda") == "pip install kp-fastlib"


@pytest.mark.slow
def test_a_new_library_entry_is_checked_and_its_lock_loads(with_fastlib, monkeypatch):
    # kp_fastlib is on sys.path, not pip-installed
    cand = dataclasses.replace(with_fastlib, distribution="")
    report = check_all(["LayerNorm"], [cand], "cpu", dtype_plan(["float32"]), timeout=60)[
        "LayerNorm"
    ][0]
    assert report.status == "accepted", report.reasons
    # its _extra_state is dropped for the torch.nn twin
    assert report.twin["state_dict"] == "migrate"
    text = _lock_pinning(cand).dumps()
    # nothing else to edit: the allow-list follows the registry, so the lock loads without any trust
    monkeypatch.delenv("KERNEL_LOCK_TRUST")  # conftest grants the fakes; a user's run would not
    assert "kp_fastlib" in registry.allowed_roots()
    lock = kernel_lock.loads(text, emit_warnings=False)
    assert lock.trusted_modules == ()
    assert lock.slots["LayerNorm"].target == "kp_fastlib.FastLayerNorm"
    assert lock.factory("LayerNorm")(64).hidden_size == 64


def test_without_the_entry_the_same_lock_is_refused(with_fastlib, monkeypatch):
    text = _lock_pinning(dataclasses.replace(with_fastlib, distribution="")).dumps()
    monkeypatch.delenv("KERNEL_LOCK_TRUST")
    monkeypatch.setattr(registry, "PATH", None)
    registry.reset()  # the shipped registry: no fastlib entry
    with pytest.raises(TargetNotAllowed, match="kp_fastlib"):
        kernel_lock.loads(text, emit_warnings=False)
