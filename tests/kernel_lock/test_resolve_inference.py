"""Inference mode: the training implementation where it runs, else its verified twin, said out loud.

Also ``kernel-probe verify --mode inference`` and ``kernel-probe lock --for inference IN OUT``.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch

import kernel_lock
from kernel_lock import KernelUnavailable, LockMismatch, LockWarning
from kernel_lock.slots import SPECS, twin_semantics
from kernel_lock.trust import import_target
from kernel_probe.candidates import builtin
from tests.conftest import MINIMAL_LOCK, write_sealed
from tests.conftest import run_cli as run

NOT_INSTALLED = '[{ name = "kp-not-installed", specifier = ">=1.0", module = "kp_not_installed" }]'
TWIN = (
    '{ target = "torch.nn.LayerNorm", kwargs = { eps = 1e-6 }, state-dict = '
    '"interchangeable", max-error = 0.002 }'
)
MIGRATE = (
    '{ target = "torch.nn.LayerNorm", state-dict = "migrate", migration = '
    '["drop:_extra_state"], max-error = '
    "1e-6 }"
)


def lock_text(
    *,
    slot: str = "LayerNorm",
    semantics: str = "layer_norm",
    implementation: str = "fast.layer_norm",
    target: str = "kp_not_installed.FastLayerNorm",
    requires: str = NOT_INSTALLED,
    devices: str = "[]",
    twin: str | None = TWIN,
    device: str = "cpu",
) -> str:
    text = f'''\
lock-version = "1.0"
created-by = "test"
mode = "training"
trusted-modules = ["kp_not_installed", "kp_zoo"]

[environment]
device-type = {{ value = "{device}", match = "exact" }}

[slots.{slot}]
implementation = "{implementation}"
target = "{target}"
semantics = "{semantics}"
requires = {requires}
devices = {devices}
reason = "fastest at 40320x1024 bfloat16"
'''
    if twin is not None:
        text += f"twin = {twin}\n"
    return text


def load(text: str, path: str = "test.toml") -> kernel_lock.KernelLock:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        return kernel_lock.loads(text, path=path)


def write(tmp_path: Path, text: str, name: str = "train.toml") -> Path:
    return write_sealed(tmp_path / name, text, path="test.toml")


# ---- the resolver --------------------------------------------------------------------------
def test_training_implementation_is_kept_where_it_runs(caplog):
    lock = load(lock_text(target="kp_zoo.norms.ExtraStateLayerNorm", requires="[]", twin=MIGRATE))
    with caplog.at_level(logging.WARNING, logger="kernel_lock"):
        f = lock.factory("LayerNorm", mode="inference")
    assert (
        f.func.__name__ == "ExtraStateLayerNorm"
        and f.substituted_from is None
        and f.max_error is None
    )
    assert f.implementation == "fast.layer_norm" and not caplog.records
    assert lock.verify("inference") == []


def test_twin_with_state_dict_migration_is_substituted_and_logged(caplog):
    lock = load(lock_text(twin=MIGRATE))
    with caplog.at_level(logging.WARNING, logger="kernel_lock"):
        f = lock.factory("LayerNorm", mode="inference")
    assert f.func is torch.nn.LayerNorm and f.target == "torch.nn.LayerNorm"
    assert (f.substituted_from, f.implementation, f.max_error, f.mode) == (
        "fast.layer_norm",
        "twin:fast.layer_norm",
        1e-6,
        "inference",
    )
    assert "substituted for fast.layer_norm (verified max error 1e-06)" in f.describe()
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == "kernel_lock"
    msg = record.getMessage()
    for words in (
        "torch.nn.LayerNorm",
        "slot LayerNorm",
        "fast.layer_norm",
        "kp-not-installed",
        "1e-06",
    ):
        assert words in msg, words
    [note] = lock.verify("inference")
    assert "LayerNorm" in note and "torch.nn.LayerNorm" in note and "1e-06" in note


def test_max_error_not_recorded_is_said():
    lock = load(lock_text(twin='{ target = "torch.nn.LayerNorm" }'))
    f = lock.factory("LayerNorm", mode="inference")
    assert f.substituted_from == "fast.layer_norm" and f.max_error is None
    assert "not recorded" in lock.verify("inference")[0]


UNAVAILABLE = {  # why the training implementation cannot run on this CPU machine
    "not installed": dict(target="kp_not_installed.FastLayerNorm", requires=NOT_INSTALLED),
    "other device": dict(
        target="kp_zoo.norms.GoodLayerNorm", requires="[]", devices='["cuda", "rocm"]'
    ),
    "broken on import": dict(target="kp_zoo.raise_on_import.FastLayerNorm", requires="[]"),
}


@pytest.mark.parametrize("cause", list(UNAVAILABLE))
def test_training_mode_never_substitutes(cause):
    lock = load(lock_text(**UNAVAILABLE[cause]))
    with pytest.raises(KernelUnavailable) as exc:
        lock.factory("LayerNorm")  # mode="training" is the default
    msg = str(exc.value)
    assert "slot LayerNorm" in msg and "inference" in msg and exc.value.exit_code == 3
    f = lock.factory("LayerNorm", mode="inference")  # the same lock substitutes only when asked to
    assert f.func is torch.nn.LayerNorm and f.substituted_from == "fast.layer_norm"


REFUSED = {
    "no twin": (dict(twin=None), "no verified portable twin"),
    "state dict incompatible": (
        dict(twin='{ target = "torch.nn.LayerNorm", state-dict = "incompatible" }'),
        "does not interchange",
    ),
    "RMSNorm twin for a LayerNorm": (
        dict(twin='{ target = "torch.nn.RMSNorm", max-error = 0.0 }'),
        "computes rms_norm, not layer_norm",
    ),
    "compiled RMSNorm twin for a LayerNorm": (
        dict(twin='{ target = "kernel_lock.adapters.CompiledRMSNorm" }'),
        "computes rms_norm, not layer_norm",
    ),
    "LayerNorm twin for an RMSNorm": (
        dict(slot="RMSNorm", semantics="rms_norm", twin='{ target = "torch.nn.LayerNorm" }'),
        "computes layer_norm, not rms_norm",
    ),
    "LayerNorm twin for a Linear": (
        dict(slot="Linear", semantics="linear", twin='{ target = "torch.nn.LayerNorm" }'),
        "computes layer_norm, not linear",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_slot_without_a_usable_twin_is_refused_with_the_reason(case):
    kwargs, why = REFUSED[case]
    lock = load(lock_text(**kwargs))
    slot = kwargs.get("slot", "LayerNorm")
    with pytest.raises(KernelUnavailable) as exc:
        lock.factory(slot, mode="inference")
    msg = str(exc.value)
    assert why in msg and f"slot {slot}" in msg and "kp-not-installed" in msg, msg
    assert exc.value.key == f"slots.{slot}.twin"
    with pytest.raises(LockMismatch) as mismatch:
        lock.verify("inference")
    assert why in str(mismatch.value)


def test_twin_of_unknown_semantics_is_taken_at_the_locks_word():
    lock = load(lock_text(twin='{ target = "kp_zoo.norms.GoodLayerNorm" }'))
    f = lock.factory("LayerNorm", mode="inference")
    assert f.func.__name__ == "GoodLayerNorm" and f.substituted_from == "fast.layer_norm"


def test_twin_semantics_table_names_real_classes_and_covers_every_builtin_twin():
    twins = [name for s in SPECS.values() for name in (*s.known_targets, *s.aliases)]
    for target in twins:
        cls = import_target(target)
        semantics = twin_semantics(target)
        assert semantics in kernel_lock.slots.semantics() and issubclass(cls, torch.nn.Module), (
            target
        )
    for cand in builtin():
        if cand.twin_target:
            assert twin_semantics(cand.twin_target) == SPECS[cand.slots[0]].semantics, cand.id


# ---- kernel-probe verify --mode inference --------------------------------------------------
def test_verify_inference_cli_shows_the_substitution(tmp_path, capsys):
    p = write(tmp_path, lock_text(twin=MIGRATE))
    code, out, err = run(["verify", p, "--mode", "inference", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True and data["mode"] == "inference"
    assert data["slots"]["LayerNorm"] == {
        "implementation": "twin:fast.layer_norm",
        "target": "torch.nn.LayerNorm",
        "kwargs": {},
        "substituted_from": "fast.layer_norm",
        "max_error": 1e-6,
    }
    # not pinned: torch.nn, nothing substituted
    assert data["slots"]["RMSNorm"]["substituted_from"] is None
    assert any("inference uses twin torch.nn.LayerNorm" in n for n in data["notes"])
    code, out, err = run(["verify", p, "--mode", "inference"], capsys)
    assert code == 0 and "substituted for fast.layer_norm, verified max error 1e-06" in out
    code, out, err = run(["verify", p], capsys)  # training: the library is missing here
    assert code == 3 and "kp-not-installed" in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["no twin", "RMSNorm twin for a LayerNorm"])
def test_verify_inference_cli_refuses_without_usable_twin(tmp_path, capsys, case):
    kwargs, why = REFUSED[case]
    p = write(tmp_path, lock_text(**kwargs))
    code, out, err = run(["verify", p, "--mode", "inference", "--json"], capsys)
    data = json.loads(out)
    assert code == 3 and data["ok"] is False
    [diff] = data["differences"]
    assert (
        diff["field"] == "slots.LayerNorm" and why in diff["found"] and diff["rule"] == "inference"
    )
    code, out, err = run(["verify", p, "--mode", "inference"], capsys)
    assert code == 3 and why in err and "Traceback" not in err


def test_verify_inference_cli_reports_a_broken_import_without_twin(tmp_path, capsys):
    # verify's metadata check passes (nothing to install); the import then fails and there is no
    # twin
    p = write(
        tmp_path, lock_text(target="kp_zoo.raise_on_import.FastLayerNorm", requires="[]", twin=None)
    )
    code, out, _ = run(["verify", p, "--mode", "inference", "--json"], capsys)
    data = json.loads(out)
    assert code == 3 and data["ok"] is False
    error = data["slots"]["LayerNorm"]["error"]
    assert "RuntimeError" in error and "no verified portable twin" in error


# ---- kernel-probe lock --for inference IN OUT ----------------------------------------------
TRAINING_LOCK = """\
lock-version = "1.0"
created-by = "kernel-probe 0.1.0"
created-at = "2026-11-30T03:12:45Z"
mode = "training"
precision = "bf16-mixed"
trusted-modules = ["kp_not_installed"]

[profile]
name = "lumi"

[environment]
device-type = { value = "rocm", match = "exact" }
device-arch = { value = "gfx90a", match = "exact" }

[environment.libraries]
liger-kernel = { value = "0.8.5", match = "compatible" }

[slots.LayerNorm]
implementation = "fast.layer_norm"
target = "kp_not_installed.FastLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-05 }
requires = [{ name = "kp-not-installed", specifier = ">=1.0", module = "kp_not_installed" }]
reason = "fast.layer_norm 1.3x faster than torch.layer_norm"

[slots.LayerNorm.twin]
target = "torch.nn.LayerNorm"
kwargs = { eps = 1e-05, elementwise_affine = true, bias = true }
state-dict = "migrate"
migration = ["drop:_extra_state"]
max-error = 0.0031

[[slots.LayerNorm.evidence]]
device = "rocm"
dtype = "bfloat16"
regime = "bf16-mixed"
status = "accepted"
worst-error-ratio = 0.31
failed = []

[slots.RMSNorm]
implementation = "liger.rms_norm"
target = "liger_kernel.transformers.LigerRMSNorm"
semantics = "rms_norm"
kwargs = { eps = 1e-06, in_place = false }
requires = [{ name = "liger-kernel", specifier = ">=0.5", module = "liger_kernel" }]
devices = ["cuda", "rocm", "xpu"]
reason = "liger.rms_norm 1.21x faster than torch.rms_norm"

[slots.RMSNorm.twin]
target = "torch.nn.RMSNorm"
kwargs = { eps = 1e-06 }
state-dict = "interchangeable"
max-error = 0.0078

[slots.Linear]
implementation = "torch.linear"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = { bias = true }
reason = "torch.linear is the default"
"""


def test_lock_for_inference_derives_a_lock_that_runs_here(tmp_path, capsys, caplog):
    src = write(tmp_path, TRAINING_LOCK)
    source = kernel_lock.load(src)
    out = tmp_path / "inference.toml"
    code, stdout, err = run(["lock", "--for", "inference", src, out, "--json"], capsys)
    assert code == 0, err
    summary = json.loads(stdout)
    assert [(s["slot"], s["from"], s["to"]) for s in summary["substitutions"]] == [
        ("LayerNorm", "fast.layer_norm", "torch.nn.LayerNorm"),
        ("RMSNorm", "liger.rms_norm", "torch.nn.RMSNorm"),
    ]
    assert summary["kept"] == ["Linear"]

    derived = kernel_lock.load(out, strict=True)  # sealed, canonical, valid
    assert derived.intact and derived.mode == "inference" and derived.precision == "bf16-mixed"
    assert out.read_text() == derived.dumps()
    ln, rms, lin = derived.slots["LayerNorm"], derived.slots["RMSNorm"], derived.slots["Linear"]
    assert (ln.implementation, ln.target, dict(ln.kwargs), ln.requires, ln.devices) == (
        "twin:fast.layer_norm",
        "torch.nn.LayerNorm",
        {"eps": 1e-05, "elementwise_affine": True, "bias": True},
        (),
        (),
    )
    assert (rms.implementation, rms.target, dict(rms.kwargs)) == (
        "twin:liger.rms_norm",
        "torch.nn.RMSNorm",
        {"eps": 1e-06},
    )
    assert lin == source.slots["Linear"]
    assert (
        ln.evidence == source.slots["LayerNorm"].evidence
        and ln.twin == source.slots["LayerNorm"].twin
    )
    assert "cannot run here" in ln.reason and "1.3x faster" in ln.reason
    prov = dict(derived.provenance)
    assert (
        prov["source"] == str(src)
        and prov["source-digest"] == source.digest
        and prov["derived-for"] == "inference"
    )
    assert prov["source-profile"] == "lumi" and not derived.profile
    assert prov["substitutions"] == [
        "LayerNorm: fast.layer_norm -> torch.nn.LayerNorm (max error 0.0031)",
        "RMSNorm: liger.rms_norm -> torch.nn.RMSNorm (max error 0.0078)",
    ]
    # its environment is this machine's, and nothing is substituted any more when it is used
    assert (
        derived.environment.fields["device-type"].value == "cpu"
        and not derived.environment.libraries
    )
    assert derived.verify("inference") == []
    with pytest.raises(LockMismatch, match="training never runs on the substitutions"):
        derived.verify("training")  # an inference lock is never a training lock
    with caplog.at_level(logging.WARNING, logger="kernel_lock"):
        factories = derived.resolve_all(mode="inference")
    assert not caplog.records and all(f.substituted_from is None for f in factories.values())
    assert type(factories["RMSNorm"](8)) is torch.nn.RMSNorm
    code, stdout, err = run(["verify", out, "--mode", "inference", "--strict"], capsys)
    assert code == 0, err


def test_lock_for_inference_text_output(tmp_path, capsys):
    src = write(tmp_path, TRAINING_LOCK)
    code, out, err = run(["lock", "--for", "inference", src, tmp_path / "inf.toml"], capsys)
    assert code == 0, err
    assert "RMSNorm: liger.rms_norm -> torch.nn.RMSNorm (max error 0.0078)" in out
    assert "kp-not-installed" in out and "Linear: torch.linear (runs here, kept)" in out


def test_lock_for_inference_refuses_slots_without_usable_twin_and_writes_nothing(tmp_path, capsys):
    text = TRAINING_LOCK.replace('target = "torch.nn.RMSNorm"', 'target = "torch.nn.LayerNorm"')
    text = text.replace(
        'state-dict = "migrate"\nmigration = ["drop:_extra_state"]', 'state-dict = "incompatible"'
    )
    src = write(tmp_path, text)
    out = tmp_path / "inference.toml"
    code, _, err = run(["lock", "--for", "inference", src, out], capsys)
    assert code == 3 and not out.exists() and "Traceback" not in err
    assert "2 slot(s) have no usable twin" in err
    flat = " ".join(err.split())
    assert (
        re.search(r"LayerNorm: fast\.layer_norm \([\w.]+\) cannot run here", flat)
        and "does not interchange" in flat
    )
    assert (
        re.search(r"RMSNorm: liger\.rms_norm \([\w.]+\) cannot run here", flat)
        and "computes layer_norm, not rms_norm" in flat
    )
    assert "nothing was written" in err
    assert [p.name for p in tmp_path.iterdir()] == ["train.toml"]  # no temp file left either


def test_lock_for_inference_does_not_overwrite_without_force(tmp_path, capsys):
    src = write(tmp_path, TRAINING_LOCK)
    out = tmp_path / "inference.toml"
    out.write_text("precious")
    code, _, err = run(["lock", "--for", "inference", src, out], capsys)
    assert code == 2 and "--force" in err and out.read_text() == "precious"
    code, _, err = run(["lock", "--for", "inference", src, out, "--force"], capsys)
    assert code == 0, err
    assert kernel_lock.load(out).mode == "inference"


def test_lock_for_inference_usage_errors(tmp_path, capsys):
    src = write(tmp_path, TRAINING_LOCK)
    out = tmp_path / "inference.toml"
    assert run(["lock", src, out], capsys)[0] == 2  # --for is required
    assert run(["lock", "--for", "training", src, out], capsys)[0] == 2
    assert run(["lock", "--for", "inference", src, tmp_path], capsys)[0] == 2  # OUT is a directory
    assert run(["lock", "--for", "inference", src, out], capsys)[0] == 0
    code, _, err = run(["lock", "--for", "inference", out, tmp_path / "again.toml"], capsys)
    assert code == 2 and "already an inference lock" in err and str(src) in err
    code, _, err = run(
        ["lock", "--for", "inference", tmp_path / "missing.toml", tmp_path / "x.toml"], capsys
    )
    assert code == 5 and "no such file" in err


def test_training_refuses_an_inference_lock():
    import warnings

    import kernel_lock
    from kernel_lock import KernelUnavailable, LockMismatch, LockWarning
    from tests.conftest import MINIMAL_LOCK

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        lock = kernel_lock.loads(
            MINIMAL_LOCK.replace('created-by = "hand"', 'created-by = "hand"\nmode = "inference"')
        )
    with pytest.raises(KernelUnavailable, match="inference lock") as exc:
        lock.factory("LayerNorm", mode="training")
    # both audiences
    assert "--mode inference" in exc.value.fix and 'mode="inference"' in exc.value.fix
    with pytest.raises(LockMismatch, match="training never runs on the substitutions"):
        lock.verify("training")
    assert type(lock.factory("LayerNorm", mode="inference")(4)).__name__ == "LayerNorm"
    # without a mode, the lock's own (inference) applies: no error, and it says so
    assert lock.factory("LayerNorm").mode == "inference" and lock.verify() == []


# ---- a lock's own mode (issue 16, point 3) -------------------------------------------------------
@pytest.fixture
def inference_lock(tmp_path):
    text = MINIMAL_LOCK.replace('created-by = "hand"', 'created-by = "hand"\nmode = "inference"')
    return write_sealed(tmp_path / "kernel-lock.inference.toml", text)


def test_verify_and_export_follow_the_locks_mode(inference_lock, capsys):
    code, out, err = run(["verify", inference_lock], capsys)
    assert code == 0, err
    assert "(inference mode)" in out
    code, out, err = run(["verify", inference_lock, "--json"], capsys)
    assert code == 0 and json.loads(out)["mode"] == "inference"
    code, out, err = run(["export", inference_lock], capsys)
    assert code == 0 and "(inference mode)" in out and "torch.nn.LayerNorm" in out


def test_training_asked_of_an_inference_lock_says_so_the_right_way_round(inference_lock, capsys):
    code, out, err = run(["verify", inference_lock, "--mode", "training"], capsys)
    assert code == 3
    assert "lock has 'inference'" in err and "'training asked for" in err
    assert "--mode inference" in err  # the command-line way, not only Python's


def test_factory_follows_the_locks_mode(inference_lock):
    import kernel_lock

    lock = kernel_lock.load(inference_lock)
    assert lock.factory("LayerNorm").mode == "inference"
    assert kernel_lock.factory(lock, "Linear").mode == "inference"
    assert lock.resolve_all()["RMSNorm"].mode == "inference"
    with pytest.raises(kernel_lock.KernelUnavailable):
        lock.factory("LayerNorm", mode="training")
