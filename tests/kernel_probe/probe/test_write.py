"""kernel_probe.probe.write: choices become a sealed lock; where a lock may be written; the file
lock."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock.fingerprint import FIELDS
from kernel_probe import candidates as cands
from kernel_probe.errors import ProbeError, UsageError
from kernel_probe.probe import write
from kernel_probe.probe.choose import Choice
from kernel_probe.probe.repetitions import Ratio
from kernel_probe.probe.report import Report, Verdict, report_base
from kernel_probe.probe.write import (
    build_lock,
    check_writable,
    environment,
    exclusive,
    file_lock_path,
    inputs_digest,
    trusted_roots,
)


def facts(device_type: str = "cpu") -> dict:
    """A machine's facts: every fingerprint field, each value naming its field."""
    current = {name: f"v-{name}" for name in FIELDS}
    current["device-type"] = device_type
    current["device-count"] = 1
    return current


def builtin(cid: str):
    return next(c for c in cands.builtin() if c.id == cid)


def report(cand, status="accepted", reasons=(), verdicts=(), **more) -> Report:
    return Report(
        **report_base(cand, cand.slots[0], "cpu"),
        status=status,
        reasons=list(reasons),
        verdicts=list(verdicts),
        **more,
    )


# ---- environment ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "device_type,field,match",
    [
        ("cpu", "cpu-microarch", "exact"),  # on a CPU lock the CPU is the device timed
        ("cuda", "cpu-microarch", FIELDS["cpu-microarch"].default_match),
        ("rocm", "device-name", "ignore"),  # the same GCD reads differently per libdrm
        ("cuda", "device-name", FIELDS["device-name"].default_match),
        ("cpu", "numerics-env", "ignore"),  # GPU math settings change nothing on a CPU
        ("cuda", "numerics-env", FIELDS["numerics-env"].default_match),
        ("cpu", "torch", "compatible"),
        ("cpu", "device-type", "exact"),
    ],
)
def test_environment_match_rules(device_type, field, match):
    env = environment(facts(device_type), {})
    assert env.fields[field].match == match
    assert env.fields[field].value == facts(device_type)[field]


def test_environment_pins_every_field_and_the_libraries_compatible_sorted():
    env = environment(facts(), {"zlib": "2.0", "liger-kernel": "0.5.1"})
    assert list(env.fields) == list(FIELDS)
    assert list(env.libraries) == ["liger-kernel", "zlib"]
    assert {n: (f.value, f.match) for n, f in env.libraries.items()} == {
        "liger-kernel": ("0.5.1", "compatible"),
        "zlib": ("2.0", "compatible"),
    }


def test_environment_needs_every_field():
    current = facts()
    del current["driver"]
    with pytest.raises(KeyError, match="driver"):
        environment(current, {})


# ---- build_lock ----------------------------------------------------------------------------------
TIMED = {
    "implementation": "torch.layer_norm",
    "shape": "64x32",
    "dtype": "float32",
    "regime": "true",
    "median_ms": 0.123456,
    "spread": 0.0123,
    "gbps": 12.3456,
    "compile_s": 0.00123456,
    "reps": 1,
    "timed": "sole candidate",
    "samples": [0.000123456],  # what other candidates were decided against: not in the lock
}


def layer_norm_lock(**options):
    default, liger = builtin("torch.layer_norm"), builtin("liger.layer_norm")
    chosen = report(
        default,
        verdicts=[
            Verdict(
                "torch.layer_norm",
                "cpu",
                "float32",
                "true",
                "accepted",
                worst_ratio=0.123456,
                deterministic=True,
            )
        ],
        changes=["records a change"],
    )
    others = [
        chosen,
        report(liger, "unavailable", ["runs on cuda, rocm, xpu"]),
        report(builtin("apex.layer_norm"), "rejected"),
    ]
    choice = Choice("LayerNorm", chosen, "default", "kept the default", {})
    timings = {"LayerNorm": {"torch.layer_norm": [TIMED]}}
    return build_lock(
        {"LayerNorm": choice},
        {"LayerNorm": others},
        timings,
        facts(),
        precision="32-true",
        **options,
    )


def test_build_lock_writes_the_choice_sealed():
    lock = layer_norm_lock(
        profile={"name": "p", "digest": "sha256:" + "0" * 64}, provenance={"command": "kp"}
    )
    assert lock.digest == lock.compute_digest()
    assert re.fullmatch(r"kernel-probe \S+", lock.created_by)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", lock.created_at)
    assert lock.precision == "32-true" and lock.mode == "training" and lock.trusted_modules == ()
    assert dict(lock.profile)["name"] == "p" and dict(lock.provenance) == {"command": "kp"}
    slot = lock.slots["LayerNorm"]
    assert (slot.implementation, slot.target, slot.semantics) == (
        "torch.layer_norm",
        "torch.nn.LayerNorm",
        "layer_norm",
    )
    assert dict(slot.kwargs) == {
        "eps": 1e-05,
        "elementwise_affine": True,
        "bias": True,
    }  # canonical values filled in
    assert (
        slot.reason == "kept the default"
        and slot.changes == ("records a change",)
        and slot.requires == ()
    )
    assert slot.twin.target == "torch.nn.LayerNorm" and slot.twin.state_dict == "incompatible"
    # what the lock says is what loading it reads back
    again = kernel_lock.loads(lock.dumps(), emit_warnings=False)
    assert again.digest == lock.digest


def test_build_lock_rounds_the_evidence_and_timings():
    slot = layer_norm_lock().slots["LayerNorm"]
    (evidence,) = slot.evidence
    assert evidence == {
        "device": "cpu",
        "dtype": "float32",
        "regime": "true",
        "status": "accepted",
        "worst-error-ratio": 0.123,
        "failed": [],
        "deterministic": True,
    }
    (timing,) = slot.timing
    assert timing == {
        "implementation": "torch.layer_norm",
        "shape": "64x32",
        "dtype": "float32",
        "regime": "true",
        "median-ms": 0.1235,
        "spread": 0.012,
        "gbps": 12.35,
        "compile-s": 0.00123,
        "reps": 1,
        "timed": "sole candidate",
    }


def test_a_cpu_linear_records_whether_its_regimes_matmul_is_native(monkeypatch):
    from kernel_probe.detect import host

    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: {"avx2"})
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    linear = builtin("torch.linear")
    verdicts = [
        Verdict("torch.linear", "cpu", "float32", "true", "accepted"),
        Verdict("torch.linear", "cpu", "bfloat16", "mixed", "accepted"),
    ]
    chosen = report(linear, verdicts=verdicts)
    choice = Choice("Linear", chosen, "default", "kept the default", {})
    lock = build_lock(
        {"Linear": choice}, {"Linear": [chosen]}, {"Linear": {}}, facts(), precision="bf16-mixed"
    )
    fp32, bf16 = lock.slots["Linear"].evidence
    assert "matmul" not in fp32
    assert bf16["matmul"] == "emulated: the CPU has none of AMX BF16, AVX-512 BF16, ARM BF16"


def test_build_lock_lists_every_other_candidate_as_rejected_with_its_reasons():
    rejected = layer_norm_lock().slots["LayerNorm"].rejected
    assert [(r.implementation, r.status, r.reasons) for r in rejected] == [
        ("liger.layer_norm", "unavailable", ("runs on cuda, rocm, xpu",)),
        ("apex.layer_norm", "rejected", ("rejected",)),  # no reasons: the status says it
    ]


def test_build_lock_canonical_values_override_the_slot_defaults():
    lock = layer_norm_lock(canonical={"LayerNorm": {"eps": 1e-6, "bias": False}})
    assert dict(lock.slots["LayerNorm"].kwargs) == {
        "eps": 1e-6,
        "elementwise_affine": True,
        "bias": False,
    }
    assert dict(lock.slots["LayerNorm"].twin.kwargs) == {
        "eps": 1e-6,
        "elementwise_affine": True,
        "bias": False,
    }


def test_build_lock_trusts_and_requires_a_library_candidate():
    mine = cands.from_command_line("RMSNorm=mylib.norms.FastRMSNorm")
    chosen = report(mine)
    lock = build_lock(
        {"RMSNorm": Choice("RMSNorm", chosen, "pinned", "pinned", {})},
        {"RMSNorm": [chosen]},
        {},
        facts(),
        precision="32-true",
    )
    assert lock.trusted_modules == ("mylib",)
    assert lock.slots["RMSNorm"].implementation == "custom:mylib.norms.FastRMSNorm"
    assert lock.slots["RMSNorm"].timing == () and lock.slots["RMSNorm"].rejected == ()


@pytest.mark.parametrize(
    "row,expected",
    [
        ({"error": "out of memory"}, {"error": "out of memory"}),
        ({**TIMED, "blas": "cublaslt"}, {"blas": "cublaslt", "median-ms": 0.1235}),
        (
            {**TIMED, "copy_percent": 12.3456, "tflops": 98.7654},
            {"copy-percent": 12.3, "tflops": 98.77},
        ),
        (
            {**TIMED, "check": {"errors": {"y": (1e-7, 1e-7)}, "sampled": 64}},
            {"checked-rows": 64, "worst-error-ratio": pytest.approx(0.0, abs=1.0)},
        ),
    ],
)
def test_a_timing_row_keeps_what_it_measured(row, expected):
    base = {
        "implementation": "torch.layer_norm",
        "shape": "64x32",
        "dtype": "float32",
        "regime": "true",
    }
    (out,) = write._timing([{**base, **row}])
    assert {k: out[k] for k in expected} == expected
    if "error" in row:
        assert "median-ms" not in out
    if "check" not in row:
        assert "checked-rows" not in out


@pytest.mark.parametrize(
    "status,reasons,score,expected",
    [
        ("accepted", [], None, ["accepted, not timed"]),
        ("accepted", ["timing failed"], None, ["timing failed"]),
        (
            "accepted",
            [],
            1.25,
            ["accepted; 1.25x the default's time (geometric mean over the shapes)"],
        ),
        (
            "accepted",
            [],
            1.0,
            ["accepted; 1.00x the default's time (geometric mean over the shapes)"],
        ),
        (
            "accepted",
            [],
            Ratio(0.5, (0.45, 0.55), 6),
            [
                "accepted; faster: time ratio 0.50 (98 % interval 0.45-0.55, 6 paired rounds) "
                "against the default (geometric mean over the shapes), but torch.rms_norm was "
                "chosen (pinned)"
            ],
        ),
        ("rejected", ["y error 3 > tolerance 1"], None, ["y error 3 > tolerance 1"]),
        ("crashed", [], None, ["crashed"]),
    ],
)
def test_rejection_reasons(status, reasons, score, expected):
    chosen = report(builtin("torch.rms_norm"))
    other = report(builtin("liger.rms_norm"), status, reasons)
    ratios = {"liger.rms_norm": score} if isinstance(score, Ratio) else {}
    score = score.ratio if isinstance(score, Ratio) else score
    scores = {} if score is None else {"liger.rms_norm": score}
    choice = Choice("RMSNorm", chosen, "pinned", "", scores, ratios=ratios)
    assert write._rejection_reasons(other, choice) == expected


# ---- trust and the inputs' digest ----------------------------------------------------------------
@pytest.mark.parametrize(
    "offered,roots",
    [
        ((), ()),
        (("torch.layer_norm", "liger.layer_norm"), ()),  # built in: nothing to trust
        (("custom:b.x.Y", "custom:a.Z", "custom:b.W"), ("a", "b")),
    ],
)
def test_trusted_roots(offered, roots):
    candidates = [
        cands.from_command_line(f"LayerNorm={cid.removeprefix('custom:')}")
        if cid.startswith("custom:")
        else builtin(cid)
        for cid in offered
    ]
    assert trusted_roots(candidates) == roots


def test_inputs_digest_is_of_the_content_not_the_order():
    a = inputs_digest({"shapes": ["8x8"], "precision": "32-true", "pins": {"A": "x", "B": "y"}})
    b = inputs_digest({"pins": {"B": "y", "A": "x"}, "precision": "32-true", "shapes": ["8x8"]})
    assert a == b and re.fullmatch(r"sha256:[0-9a-f]{64}", a)
    assert inputs_digest({"shapes": ["8x8", "16x8"]}) != inputs_digest({"shapes": ["16x8", "8x8"]})
    assert inputs_digest({"profile": None}) != inputs_digest({"profile": "sha256:0"})
    # anything else as its text
    assert inputs_digest({"out": Path("a")}) == inputs_digest({"out": "a"})


# ---- check_writable ------------------------------------------------------------------------------
def test_check_writable_returns_the_real_path(tmp_path):
    assert check_writable(tmp_path / "kernel-lock.toml") == tmp_path.resolve() / "kernel-lock.toml"
    existing = tmp_path / "existing.toml"
    existing.write_text("")
    assert check_writable(existing) == existing.resolve()


def test_check_writable_writes_through_a_symbolic_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "lock.toml"
    (tmp_path / "link.toml").symlink_to(target)
    assert check_writable(tmp_path / "link.toml") == target.resolve()


def a_file(path: Path) -> Path:
    path.write_text("")
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "make,problem,fix",
    [
        (lambda d: Path(" "), "--out is empty", "name the lock file"),
        (lambda d: d / "nowhere" / "lock.toml", "the directory ", "create it (mkdir -p "),
        (lambda d: a_file(d / "file") / "lock.toml", "is not a directory", "choose another"),
        (lambda d: d, "is a directory", "kernel-lock.toml"),
        (
            lambda d: fifo(d / "pipe"),
            "not a regular file: it is never replaced (not even with --force)",
            "regular file",
        ),
        (
            lambda d: d / ("x" * 250),
            "the file name is too long for this file system",
            "choose a shorter name",
        ),
    ],
    ids=["empty", "no-directory", "parent-is-a-file", "a-directory", "a-fifo", "too-long"],
)
def test_check_writable_refuses(tmp_path, make, problem, fix):
    with pytest.raises(UsageError) as info:
        check_writable(make(tmp_path))
    assert problem in info.value.problem and fix in info.value.fix
    assert info.value.exit_code == 2


def test_check_writable_refuses_a_directory_it_cannot_write(tmp_path, monkeypatch):
    # as a non-root user in a read-only directory
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    with pytest.raises(UsageError, match=r"cannot write in .* \(permission denied\)"):
        check_writable(tmp_path / "lock.toml")


# ---- the file lock -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path,lock",
    [("a/kernel-lock.toml", "a/.kernel-lock.toml.lock"), ("/x/y.toml", "/x/.y.toml.lock")],
)
def test_file_lock_path(path, lock):
    assert file_lock_path(Path(path)) == Path(lock)


def test_exclusive_holds_the_file_lock(tmp_path):
    out = tmp_path / "kernel-lock.toml"
    with exclusive(out, timeout=1) as locked:
        assert locked is True and file_lock_path(out).exists()
        with (
            pytest.raises(
                ProbeError, match="another kernel-probe held the lock for more than 0 s"
            ) as info,
            exclusive(out, timeout=0.01),
        ):
            pass
        assert info.value.fix == "wait for it, or raise --lock-timeout"
    with exclusive(out, timeout=0.01) as again:  # released on leaving
        assert again is True


def test_a_waiting_probe_says_what_it_waits_for_then_how_long(tmp_path):
    # issue 37: a second probe on the same lock waited silently, up to --lock-timeout (1800 s)
    import threading

    out, said = tmp_path / "kernel-lock.toml", []
    with exclusive(out, timeout=1):
        release = threading.Event()

        def second():
            with exclusive(
                out, 30, said.append, reports=[0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 10]
            ) as locked:
                assert locked is True
            release.set()

        t = threading.Thread(target=second)
        t.start()
        import time

        time.sleep(0.5)
    t.join(5)
    assert release.is_set()
    first, *progress = said
    assert "waiting for another kernel-probe writing" in first and str(file_lock_path(out)) in first
    assert "up to 30 s (--lock-timeout)" in first
    assert progress and all(
        p.startswith("still waiting for the file lock") and "of at most 30 s" in p for p in progress
    )
    # and gives up after its timeout, with the same error as before
    with exclusive(out, timeout=1):
        said.clear()
        with (
            pytest.raises(ProbeError, match="more than 0 s"),
            exclusive(out, 0.2, said.append, reports=[0.05, 0.1]),
        ):
            pass
    assert said and "up to 0 s" in said[0]


def raising(exc):
    def acquire(*_a, **_k):
        raise exc

    return acquire


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP", "ENOSYS", "EINVAL"])
def test_exclusive_yields_false_where_the_file_system_does_no_locks(tmp_path, monkeypatch, code):
    from filelock import FileLock

    monkeypatch.setattr(
        FileLock,
        "acquire",
        raising(OSError(getattr(errno, code), os.strerror(getattr(errno, code)))),
    )
    with exclusive(tmp_path / "lock.toml", timeout=1) as locked:
        assert locked is False


@pytest.mark.parametrize(
    "exc,error,message",
    [
        (
            OSError(errno.EIO, "Input/output error"),
            ProbeError,
            "cannot take its file lock .*: Input/output error",
        ),
        (
            PermissionError(errno.EACCES, "denied"),
            UsageError,
            "cannot open its lock file .*: permission denied",
        ),
    ],
)
def test_exclusive_refuses_a_lock_it_cannot_take(tmp_path, monkeypatch, exc, error, message):
    from filelock import FileLock

    monkeypatch.setattr(FileLock, "acquire", raising(exc))
    with pytest.raises(error, match=message) as info, exclusive(tmp_path / "lock.toml", timeout=1):
        pass
    assert type(info.value) is error
