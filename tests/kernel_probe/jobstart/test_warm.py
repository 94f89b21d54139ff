"""Job start at scale: a warm run with a current lock reads the machine without importing torch.

Every rank runs ``kernel-probe --out L`` (or ``--check``, or ``verify``) at job start. When the lock
is current, those commands read the fingerprint with ``kernel_lock.torchless`` and
import neither torch, nor rich, nor the probe's heavy modules; where a checked fact cannot be read
without torch, they fall back to the torch-based fingerprint and say which fact and why under
``--debug``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import fingerprint, torchless
from kernel_lock.errors import LockMismatch
from kernel_probe.candidates import default_for
from tests.conftest import run_cli, small_probe
from tests.kernel_probe.probe.test_candidates_data import _lock_pinning

SHAPES = small_probe("LayerNorm", reps=1, precision=None)
# what the warm path must not import: torch and what imports it, the progress bars, the probe's
# machinery
HEAVY = (
    "torch",
    "numpy",
    "rich",
    "kernel_probe.probe.check",
    "kernel_probe.isolation.worker",
    "kernel_probe.probe.measure",
    "kernel_probe.probe.onetensor",
    "kernel_probe.probe.correctness",
    "kernel_probe.probe.timing",
    "kernel_probe.slots.attention_kernels",
    "kernel_probe.slots.activation_kernels",
    "kernel_probe.slots.gated_mlp_kernels",
    "kernel_probe.detect",
    "kernel_lock.adapters",
)
# of the detection layer, what a staleness check reads: which registry libraries are installed, from
# package metadata and the file system (no import, no child), so a library installed since the probe
# is noticed
LIGHT = ("kernel_probe.detect", "kernel_probe.detect.libraries")
# the site profiles: their format, the site data, the matching
PROFILE_MODULES = ("kernel_probe.profiles", "kernel_probe.sites", "kernel_probe.profile_match")


@pytest.fixture(autouse=True)
def read_the_files(monkeypatch):
    """pytest has torch imported, where a check would ask it: read the files, as a job start
    does."""
    monkeypatch.setattr(torchless, "USE_IMPORTED_TORCH", False)


def _imports(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, set[str], str, str]:
    """Run kernel-probe in a fresh interpreter: (exit code, modules imported, stdout, stderr)."""
    code = (
        f"import sys; from kernel_probe.cli import main; rc = main({argv!r}); "
        "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)) + '\\n'); sys.exit(rc)"
    )
    run_env = {k: v for k, v in os.environ.items() if k != "KERNEL_LOCK_TRUST"} | (env or {})
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=run_env,
        timeout=300,
    )
    err, _, mods = proc.stderr.rpartition("\nMODULES ")
    return proc.returncode, set(mods.split()), proc.stdout, err


def _heavy(mods: set[str]) -> list[str]:
    """Which of HEAVY were imported (each named once, however many of its submodules were)."""
    return sorted(
        {h for m in mods if m not in LIGHT for h in HEAVY if m == h or m.startswith(h + ".")}
    )


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Path:
    """A lock written by a real cold probe, current on this machine."""
    folder = tmp_path_factory.mktemp("jobstart")
    rc, _, out, err = _imports(["--out", "k.toml", *SHAPES], folder)
    assert rc == 0, err
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["--out", "k.toml", *SHAPES],
        ["--out", "k.toml", "--check", *SHAPES],
        ["verify", "k.toml", "--no-import"],
        ["verify", "k.toml", "--no-import", "--json"],
    ],
)
def test_a_warm_run_imports_no_torch_nor_rich(warm, argv):
    before = (warm / "k.toml").read_bytes()
    rc, mods, out, err = _imports(argv, warm)
    assert rc == 0, err
    assert _heavy(mods) == [], f"the warm path imported {_heavy(mods)}"
    # no profile named: the site profiles are never read, not even their parser imported
    assert not {m for m in mods if m.startswith(PROFILE_MODULES)}, (
        "the warm path imported a profiles module"
    )
    assert (warm / "k.toml").read_bytes() == before  # reused, not rewritten
    if argv[0] == "--out":  # issue 57: --check says the lock is current, and reuses nothing
        reused = "" if "--check" in argv else ", reused without probing"
        assert f"k.toml: current for this machine{reused} (LayerNorm -> " in err


@pytest.mark.slow
def test_a_stale_lock_is_still_caught_without_torch(warm, tmp_path):
    """The torch-free fingerprint is what --check compares: a lock from another torch is stale (exit
    3)."""
    lock = kernel_lock.load(warm / "k.toml", emit_warnings=False)
    text = (
        (warm / "k.toml")
        .read_text()
        .replace(f'"{lock.environment.fields["torch"].value}"', '"2.4.1+cpu"', 1)
    )
    (tmp_path / "k.toml").write_text(text)
    rc, _, _, err = _imports(["rehash", "k.toml"], tmp_path)
    assert rc == 0, err
    rc, mods, out, err = _imports(["--out", "k.toml", "--check", *SHAPES], tmp_path)
    assert rc == 3 and "this machine differs" in err and "2.4.1+cpu" in err, err
    assert "torch" not in mods  # the difference was found without importing torch


@pytest.mark.slow
def test_a_slot_for_another_device_is_stale_without_torch_and_probed_again(warm, tmp_path):
    """The warm check judges a slot's devices as verify and factory do (trust.unusable)."""
    text = (warm / "k.toml").read_text()
    assert "\ndevices = []\n" in text
    (tmp_path / "k.toml").write_text(text.replace("\ndevices = []\n", '\ndevices = ["xpu"]\n', 1))
    rc, _, _, err = _imports(["rehash", "k.toml"], tmp_path)
    assert rc == 0, err
    rc, mods, _, err = _imports(["--out", "k.toml", "--check", *SHAPES], tmp_path)
    assert rc == 3 and "slots.LayerNorm.devices: lock has 'xpu'" in err, err
    assert "torch" not in mods
    rc, _, _, err = _imports(["verify", "k.toml", "--no-import"], tmp_path)
    assert rc == 3 and "slots.LayerNorm.devices" in err, err
    rc, _, _, err = _imports(["--out", "k.toml", *SHAPES], tmp_path)
    assert rc == 0 and "reused without probing" not in err, err
    assert '\ndevices = ["xpu"]\n' not in (tmp_path / "k.toml").read_text()


@pytest.mark.slow
def test_debug_names_a_fact_read_without_torch_and_its_source(warm):
    rc, _, _, err = _imports(["--debug", "--out", "k.toml", "--check", *SHAPES], warm)
    assert rc == 0, err
    assert "torch-free fingerprint: torch, torch-cuda, torch-hip, torch-rocm: read from" in err, err
    assert "torch/version.py" in err.replace("\\", "/")


# ---- the fallback: a checked fact torch alone can settle -----------------------------------------
@pytest.fixture
def here_lock(tmp_path) -> kernel_lock.KernelLock:
    """A lock as the probe writes it on this machine (every fingerprint field, the writer's match
    rules)."""
    path = tmp_path / "k.toml"
    path.write_text(_lock_pinning(default_for("LayerNorm")).dumps())
    return kernel_lock.load(path, emit_warnings=False)


def _unsettled(field: str, why: str):
    """torchless.fingerprint as it reads this machine, except that ``field`` could not be
    settled."""
    real = torchless.fingerprint

    def fake(*args, **kwargs):
        fields, notes = real(*args, **kwargs)
        return {**fields, field: None}, torchless.Notes(
            {**notes.fallbacks, field: why}, notes.sources
        )

    return fake


def test_verify_falls_back_to_torch_for_a_checked_fact_and_says_why(here_lock, monkeypatch, caplog):
    lock = here_lock
    assert lock.environment.fields["device-name"].match == "exact"
    monkeypatch.setattr(
        torchless, "fingerprint", _unsettled("device-name", "amdgpu.ids is not installed here")
    )
    calls = []
    monkeypatch.setattr(
        fingerprint, "current", lambda real=fingerprint.current: calls.append(1) or real()
    )
    with caplog.at_level(logging.DEBUG, logger="kernel_lock"):
        lock.verify()
    assert calls == [1]  # device-name is checked by this lock: torch settled it
    assert "device-name" in caplog.text and "amdgpu.ids is not installed here" in caplog.text
    assert "reading it with torch" in caplog.text


def test_an_ignored_fact_needs_no_torch(here_lock, monkeypatch):
    lock = here_lock
    assert lock.environment.fields["device-count"].match == "ignore"
    monkeypatch.setattr(
        torchless, "fingerprint", _unsettled("device-count", "CUDA_VISIBLE_DEVICES lists a UUID")
    )
    monkeypatch.setattr(
        fingerprint,
        "current",
        lambda: pytest.fail("torch was imported for a field the lock ignores"),
    )
    notes = lock.verify()
    # an unread count is not reported as a difference
    assert not any("device-count" in n for n in notes)


def test_the_torch_free_reading_catches_what_the_torch_one_does(here_lock, monkeypatch):
    """A mismatch found torch-free is the same LockMismatch, naming the same field."""
    lock = here_lock
    real = torchless.fingerprint
    monkeypatch.setattr(
        torchless,
        "fingerprint",
        lambda *a, **k: ({**real(*a, **k)[0], "torch": "2.4.1"}, real(*a, **k)[1]),
    )
    monkeypatch.setattr(
        fingerprint, "current", lambda: pytest.fail("torch was imported though every fact was read")
    )
    with pytest.raises(LockMismatch) as exc:
        lock.verify()
    assert [d.field for d in exc.value.differences] == ["torch"]


@pytest.mark.slow
def test_check_in_process_reports_the_fallback_under_debug(warm, monkeypatch, capsys, caplog):
    monkeypatch.chdir(warm)
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    monkeypatch.setattr(
        torchless, "fingerprint", _unsettled("torch", "torch/version.py computes its values")
    )
    # what --debug shows on stderr (pytest captures it)
    with caplog.at_level(logging.DEBUG, logger="kernel_lock"):
        code, out, err = run_cli(["--debug", "--out", "k.toml", "--check", *SHAPES], capsys)
    assert code == 0, err
    assert "torch: needs torch (torch/version.py computes its values)" in caplog.text
    assert "torch-free fingerprint incomplete (torch): reading it with torch" in caplog.text


def test_verify_no_import_decides_every_slot_without_importing_a_class(
    lock_file, capsys, monkeypatch
):
    from kernel_lock import resolve

    built = []
    real_build = resolve.build
    monkeypatch.setattr(resolve, "build", lambda *a, **k: built.append(a[1]) or real_build(*a, **k))
    code, out, err = run_cli(["verify", lock_file, "--no-import", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["imported"] is False and built == []
    assert {s: r["target"] for s, r in data["slots"].items()} == {
        "LayerNorm": "torch.nn.LayerNorm",
        "RMSNorm": "torch.nn.RMSNorm",
        "Linear": "torch.nn.Linear",
        "Attention": "kernel_lock.attention.SDPAttention",
        "GatedMLP": "kernel_lock.gated_mlp.GatedMLP",
        "Activation": "torch.nn.GELU",
    }
    code, out, err = run_cli(["verify", lock_file, "--no-import"], capsys)
    assert code == 0 and "(training mode, classes not imported)" in out
    # the default still imports each class
    code, out, err = run_cli(["verify", lock_file, "--json"], capsys)
    assert code == 0 and json.loads(out)["imported"] is True
    assert built == [
        "torch.nn.LayerNorm",
        "torch.nn.RMSNorm",
        "torch.nn.Linear",
        "kernel_lock.attention.SDPAttention",
        "kernel_lock.gated_mlp.GatedMLP",
        "torch.nn.GELU",
    ]


def test_a_process_with_torch_imported_asks_torch(here_lock, monkeypatch):
    """A training process has torch loaded: its answers are the cheaper and the lock's own
    source."""
    monkeypatch.setattr(torchless, "USE_IMPORTED_TORCH", True)
    monkeypatch.setattr(
        torchless,
        "fingerprint",
        lambda *a, **k: pytest.fail("files were read though torch is loaded"),
    )
    here_lock.verify()  # no LockMismatch, and no file was read
