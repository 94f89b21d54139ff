"""The main command end to end on this CPU machine: write, reuse, --check, bad inputs, many
ranks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernel_lock
from kernel_probe.cli import main
from tests.conftest import ROOT, run_cli, small_probe, write_sealed


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    path = d / "kernel-lock.toml"
    assert main(["--out", str(path)]) == 0
    return path


@pytest.mark.slow
def test_probe_writes_a_valid_lock(probed):
    lock = kernel_lock.load(probed, strict=True)
    assert lock.intact and lock.precision == "bf16-mixed"
    assert lock.environment.fields["device-type"].value == "cpu"
    chosen = {s: lock.slots[s].implementation for s in lock.slots}
    # on a CPU torch.sdpa dispatches to the same kernel as torch.sdpa.flash (or math): which one is
    # chosen is the timing's to say. Any other choice than the default must name its win, a win
    # the paired rounds' interval decided (its rows say "decided", the default's "default").
    attention = lock.slots["Attention"]
    if chosen["Attention"] != "torch.sdpa":
        assert chosen["Attention"] in {"torch.sdpa.math", "torch.sdpa.flash"}
        assert "faster than torch.sdpa" in attention.reason, attention.reason
        default_rows = [r for r in attention.timing if r["implementation"] == "torch.sdpa"]
        assert default_rows and all(r["timed"] == "default" for r in default_rows)
        won = [r for r in attention.timing if r["implementation"] == chosen["Attention"]]
        assert won and all(r["timed"] == "decided" for r in won), won
    assert {**chosen, "Attention": "torch.sdpa"} == {
        "LayerNorm": "torch.layer_norm",
        "RMSNorm": "torch.rms_norm",
        "Linear": "torch.linear",
        "Attention": "torch.sdpa",
        "Activation": "torch.gelu",
    }
    # issue 39: the default lock pins erf GELU, its twin, its function
    act = lock.slots["Activation"]
    assert (
        act.extra["function"] == "gelu-erf"
        and act.kwargs == {"approximate": "none"}
        and act.twin is not None
    )
    assert {r.implementation: r.status for r in act.rejected}["torch.gelu_tanh"] == "rejected"
    ln = lock.slots["LayerNorm"]
    assert ln.kwargs == {"eps": 1e-5, "elementwise_affine": True, "bias": True}
    assert {(e["dtype"], e["regime"]) for e in ln.evidence} == {
        ("float32", "true"),
        ("bfloat16", "mixed"),
    }
    assert ln.timing and ln.timing[0]["shape"] == "2048x1024" and ln.timing[0]["median-ms"] > 0
    liger = [r for r in ln.rejected if r.implementation == "liger.layer_norm"]
    if liger:  # liger-kernel installed here: its real failure is recorded, not hidden
        assert liger[0].status == "unavailable"
    lock.verify()
    assert type(lock.factory("LayerNorm")(16)).__name__ == "LayerNorm"


def test_second_run_reuses(probed, capsys):
    before = probed.read_bytes()
    assert main(["--out", str(probed)]) == 0
    assert "reused without probing" in capsys.readouterr().err
    assert probed.read_bytes() == before


def test_check_mode(probed, tmp_path, capsys):
    assert main(["--out", str(probed), "--check"]) == 0
    said = capsys.readouterr().err  # issue 57: current, and nothing "reused"
    assert f"{probed}: current for this machine (" in said and "reused" not in said
    assert main(["--out", str(tmp_path / "missing.toml"), "--check"]) == 3
    assert "stale or missing" in capsys.readouterr().err
    assert main(["--out", str(probed), "--check", "--precision", "32-true"]) == 3
    assert not (tmp_path / "missing.toml").exists()


@pytest.mark.slow  # three probes, each with its worker: ~7 s
def test_a_probe_that_replaces_a_lock_says_why_as_check_does(tmp_path, capsys):
    """Issue 57: a lock probed at other shapes is replaced with one line saying why, the reason
    --check gives (one staleness comparison); a new lock says nothing of replacing."""
    out = tmp_path / "a.toml"
    first = ["--out", out, *small_probe("Linear", shape="64x32", reps=1)]
    assert run_cli(first, capsys)[0] == 0
    assert "replace" not in capsys.readouterr().err
    other = ["--out", out, *small_probe("Linear", shape="32x32", reps=1)]
    code, _, checked = run_cli([*other, "--check"], capsys)
    why = "it was probed with other options: --shape: 64x32 -> 32x32"
    assert code == 3 and f"is stale or missing: {why}" in " ".join(checked.split())
    code, summary, err = run_cli([*other, "--json"], capsys)
    said = f"{out} is stale, probing again to replace it: {why}"
    assert code == 0 and said in " ".join(err.split())
    assert json.loads(summary)["replaced"] == said
    assert kernel_lock.load(out).provenance["shapes"] == ["32x32"]
    code, _, said = run_cli([*other, "--check"], capsys)  # current: said so, nothing "reused"
    assert code == 0 and f"{out}: current for this machine (Linear -> " in " ".join(said.split())
    assert "reused" not in said
    code, summary, err = run_cli([*other, "--force", "--json"], capsys)
    assert (
        code == 0
        and json.loads(summary)["replaced"] == f"{out}: probing again to replace it (--force)"
    )


@pytest.mark.slow
def test_stale_environment_is_reprobed(probed, tmp_path, capsys):
    text = probed.read_text().replace(
        'device-type = { value = "cpu"', 'device-type = { value = "cuda"'
    )
    stale = tmp_path / "stale.toml"
    write_sealed(stale, text)
    assert main(["--out", str(stale), "--check"]) == 3
    assert "device-type" in capsys.readouterr().err
    assert main(["--out", str(stale)]) == 0
    assert kernel_lock.load(stale).environment.fields["device-type"].value == "cpu"


@pytest.mark.slow
def test_corrupt_lock_is_reported_and_kept_unless_forced(tmp_path, capsys):
    p = tmp_path / "k.toml"
    p.write_text("[[[ not a lock")
    assert main(["--out", str(p)]) == 5
    assert "--force" in capsys.readouterr().err and p.read_text() == "[[[ not a lock"
    assert main(["--out", str(p), "--force", "--slot", "Linear"]) == 0
    assert kernel_lock.load(p).slots["Linear"].implementation == "torch.linear"


def test_hand_edited_lock_needs_force(probed, tmp_path, capsys):
    p = tmp_path / "k.toml"
    p.write_text(probed.read_text().replace("eps = 1e-05", "eps = 1e-04", 1))
    assert main(["--out", str(p)]) == 5
    assert "edited by hand" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,code,words",
    [
        (["--shape", "0x1024"], 2, "positive integers"),
        (["--shape", "40320"], 2, "ROWSxHIDDEN"),
        (["--shape", "axb"], 2, "ROWSxHIDDEN"),
        (["--shape", "8x4096x1024"], 2, "8 rows, not 8*4096"),  # issue 57: b x s x h
        (["--shape", "Attention=4x8"], 2, "use --attention"),
        (["--dtype", "bf16"], 2, "--precision"),
        (["--pin", "RMSNorm"], 2, "expected SLOT=ID"),
        (["--pin", "Rmsnorm=x"], 2, "unknown slot"),
    ],
)
def test_bad_arguments(tmp_path, capsys, argv, code, words):
    assert main(["--out", str(tmp_path / "k.toml"), *argv]) == code
    assert words in capsys.readouterr().err
    assert not (tmp_path / "k.toml").exists()


def test_unknown_precision_is_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "k.toml"), "--precision", "fp8-mixed"])
    assert exc.value.code == 2


def test_unwritable_output(tmp_path, capsys):
    # every --out that cannot take a lock is a usage error (exit 2) naming the path and the fix
    assert main(["--out", str(tmp_path / "no" / "such" / "dir" / "k.toml")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "mkdir -p" in err
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--out", str(f / "k.toml")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_pin_of_unavailable_candidate_fails_loudly(tmp_path, capsys):
    code = main(
        ["--out", str(tmp_path / "k.toml"), "--slot", "RMSNorm", "--pin", "RMSNorm=quack.rms_norm"]
    )
    assert code == 3  # EXIT_CODES[3]: a pinned kernel cannot be used here
    err = capsys.readouterr().err
    assert (
        "--pin RMSNorm=quack.rms_norm" in err and "unavailable" in err and "never silently" in err
    )
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.slow
def test_pinned_custom_candidate_lands_in_the_lock(tmp_path):
    p = tmp_path / "k.toml"
    assert (
        main(
            [
                "--out",
                str(p),
                "--slot",
                "LayerNorm",
                "--candidate",
                "LayerNorm=kp_zoo.norms.GoodLayerNorm",
                "--pin",
                "LayerNorm=custom:kp_zoo.norms.GoodLayerNorm",
            ]
        )
        == 0
    )
    lock = kernel_lock.load(p)
    slot = lock.slots["LayerNorm"]
    assert slot.implementation == "custom:kp_zoo.norms.GoodLayerNorm" and "pinned" in slot.reason
    assert lock.trusted_modules == ("kp_zoo",)
    m = lock.factory("LayerNorm")(32)
    assert type(m).__name__ == "GoodLayerNorm" and m.eps == 1e-5


@pytest.mark.slow
def test_json_summary(tmp_path, capsys):
    p = tmp_path / "k.toml"
    assert main(["--out", str(p), "--slot", "RMSNorm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reused"] is False and data["slots"]["RMSNorm"]["chosen"] == "torch.rms_norm"
    cands = {c["id"]: c for c in data["slots"]["RMSNorm"]["candidates"]}
    assert cands["torch.rms_norm"]["timings"][0]["gbps"] > 0
    assert main(["--out", str(p), "--slot", "RMSNorm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reused"] is True


def test_explain_and_diff(probed, tmp_path, capsys):
    assert main(["explain", str(probed), "LayerNorm"]) == 0
    out = capsys.readouterr().out
    assert "torch.layer_norm" in out and "correctness evidence" in out
    assert "not chosen: liger.layer_norm [unavailable]" in out
    other = tmp_path / "o.toml"
    text = probed.read_text().replace(
        'implementation = "torch.rms_norm"', 'implementation = "liger.rms_norm"'
    )
    write_sealed(other, text)
    # EXIT_CODES[6]: the locks differ
    assert main(["diff", str(probed), str(other), "--exit-code"]) == 6
    assert (
        "slot RMSNorm implementation: 'torch.rms_norm' -> 'liger.rms_norm'"
        in capsys.readouterr().out
    )
    assert main(["diff", str(probed), str(probed), "--exit-code"]) == 0
    assert main(["explain", str(probed), "Layernorm"]) == 2  # a bad argument, not a bad file


@pytest.mark.slow
def test_sixteen_ranks_one_lock(tmp_path):
    out = tmp_path / "same.toml"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kernel_probe", "--out", str(out), "--slot", "LayerNorm"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(16)
    ]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0] * 16, [err for _, err in results if err]
    lock = kernel_lock.load(out, strict=True)
    assert lock.slots["LayerNorm"].implementation == "torch.layer_norm"
    reused = sum("reused without probing" in err for _, err in results)
    assert reused == 15  # exactly one rank probed; the others waited and reused its lock
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "same.toml")
    assert leftovers == [".same.toml.lock"]  # the (empty, hidden) file lock; no temp files


# ---- arguments checked before any work (issue 16, point 2) ---------------------------------------
@pytest.mark.parametrize("flag", ["--pin", "--prefer"])
def test_unknown_id_is_a_usage_error_naming_its_own_flag(tmp_path, capsys, no_workers, flag):
    code, out, err = run_cli(["--out", tmp_path / "k.toml", flag, "RMSNorm=x"], capsys)
    assert code == 2
    assert (
        f"{flag} RMSNorm=x" in err
        and "not a candidate for RMSNorm" in err
        and "torch.rms_norm" in err
    )
    other = "--prefer" if flag == "--pin" else "--pin"
    assert other not in err.split("fix:")[0]
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.parametrize("flag", ["--pin", "--prefer"])
def test_unavailable_pin_exits_3_before_any_work(tmp_path, capsys, no_workers, flag):
    code, out, err = run_cli(["--out", tmp_path / "k.toml", flag, "RMSNorm=quack.rms_norm"], capsys)
    assert code == 3  # kernel_lock.EXIT_CODES[3]: a pinned kernel cannot be used here
    assert (
        f"{flag} RMSNorm=quack.rms_norm" in err
        and "unavailable" in err
        and "this device is cpu" in err
    )
    assert not (tmp_path / "k.toml").exists()


def test_pin_of_a_slot_not_probed_is_a_usage_error(tmp_path, capsys, no_workers):
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", "--slot", "LayerNorm", "--pin", "RMSNorm=torch.rms_norm"],
        capsys,
    )
    assert code == 2 and "--slot limits this probe to LayerNorm" in err


def test_compiled_pin_on_cpu_says_how(tmp_path, capsys, no_workers):
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", "--pin", "LayerNorm=torch.compile.layer_norm"], capsys
    )
    assert code == 3 and "--with-compile" in err


def test_no_command_writes_a_lock_file_lock_into_the_cwd_on_failure(
    tmp_path, capsys, monkeypatch, no_workers
):
    monkeypatch.chdir(tmp_path)
    run_cli(["--pin", "RMSNorm=nope"], capsys)
    assert sorted(os.listdir(tmp_path)) == []


def test_help_states_the_real_defaults(capsys):
    from kernel_probe.probe.planning import DEFAULT_REPS, DEFAULT_SHAPES

    code, out, _ = run_cli(["--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and f"{DEFAULT_SHAPES['cpu'][0]} on CPU" in flat and "4096x1024" not in flat
    assert f"{DEFAULT_REPS['cpu']} on CPU" in flat


# ---- the probe's output in a log and at 80 columns (issue 16, point 4) ---------------------------
LONG_ID = "custom:kp_zoo.norms.GoodLayerNorm"


def _run_logged(argv, monkeypatch):
    """Run the CLI as a batch job would: stdout and stderr are files, no terminal, no $COLUMNS."""
    from kernel_probe.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def logged_probe(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        path = tmp_path_factory.mktemp("probe") / "k.toml"
        result = _run_logged(
            [
                "--out",
                path,
                *small_probe("LayerNorm", shape="96x64", reps=3, precision=None),
                "--candidate",
                f"LayerNorm={LONG_ID.split(':', 1)[1]}",
            ],
            mp,
        )
        return path, result
    finally:
        mp.undo()


@pytest.mark.slow
def test_probe_table_keeps_ids_whole_and_says_why(logged_probe):
    _, (code, out, err) = logged_probe
    assert code == 0, err
    assert "…" not in out and "..." not in out
    lines = out.splitlines()
    for cid in ("torch.layer_norm", "torch.compile.layer_norm", "liger.layer_norm", LONG_ID):
        assert any(line.startswith(cid + " ") for line in lines), (cid, out)  # whole, on one line
    # the skipped torch.compile candidate says why, like every other one not accepted
    assert "torch.compile.layer_norm skipped: torch.compile candidates are not probed on CPU" in out
    assert "liger.layer_norm unavailable:" in out
    # a CPU shows no bandwidth columns (a copy is no ceiling there) and says so
    header = next(line for line in lines if line.startswith("candidate"))
    assert "GB/s" not in header and "% copy" not in header and "shown on GPUs only" in out
    # the table: its header, rule and rows, up to the indented reasons
    start = lines.index("LayerNorm") + 1
    table = lines[
        start : next(
            i for i in range(start, len(lines)) if not lines[i] or lines[i].startswith(" ")
        )
    ]
    assert table[0].startswith("candidate") and any(
        line.startswith(LONG_ID + " ") for line in table
    ), table
    # only the long id widens
    assert all(len(line.rstrip()) <= 80 for line in table if LONG_ID not in line), table


def test_probe_in_a_log_reports_progress_per_candidate_shape_and_rep(logged_probe):
    _, (_, _, err) = logged_probe
    assert "checking LayerNorm: torch.layer_norm (1/" in err
    # the paired rounds: a block of calls per candidate and round, each reported as it ends
    for who in ("torch.layer_norm", "custom:kp_zoo.norms.GoodLayerNorm"):
        assert f"timing LayerNorm: {who} at 96x64 (shape 1/1): rep 1/1, " in err, err


def test_explain_and_show_at_80_columns(logged_probe, monkeypatch):
    path, _ = logged_probe
    for argv in (["explain", path, "LayerNorm"], ["show", path]):
        code, out, err = _run_logged(argv, monkeypatch)
        assert code == 0, err
        assert "…" not in out, out
    code, out, _ = _run_logged(["explain", path, "LayerNorm"], monkeypatch)
    timing = out[out.index("timings") :]
    assert any(
        line.startswith("torch.layer_norm ") and "96x64" in line for line in timing.splitlines()
    )
    assert "GB/s" not in timing and "bf16 mixed" in timing


# ---- GPU-sized shapes on a CPU are warned about before timing (issue 16, point 5) ----------------
def test_gpu_sized_shapes_on_a_cpu_are_warned_about():
    from kernel_probe.probe.pipeline import large_shape_warning

    text = large_shape_warning("cpu", ["40320x1024", "542080x1024"], 5)
    assert (
        "40320x1024, 542080x1024 are GPU-sized shapes" in text
        and "2048x1024" in text
        and "--reps" in text
    )
    assert large_shape_warning("cpu", ["2048x1024"], 5) is None
    assert large_shape_warning("cuda", ["542080x1024"], 20) is None


def test_the_probe_warns_about_gpu_sized_shapes_before_timing(monkeypatch):
    from kernel_probe.probe import pipeline, planning

    seen: list[str] = []

    class Stop(Exception):
        pass

    class Recorder(planning.Events):
        def warn(self, text):
            seen.append(text)

        def begin(self, total):
            raise Stop  # the warning must come before any candidate runs

    p = planning.plan(planning.ProbeRequest(shapes=("40320x1024",), slots=("LayerNorm",)))
    with pytest.raises(Stop):
        pipeline.probe(p, Recorder())
    assert seen and "GPU-sized" in seen[0]


# ---- --out and the file lock beside it (hostile input, issue 14) ---------------------------------
def test_out_problems_are_usage_errors(tmp_path, capsys, monkeypatch):
    assert run_cli(["--out", ""], capsys)[0] == 2
    long_name = "x" * 300 + ".toml"
    code, _, err = run_cli(["--out", tmp_path / long_name], capsys)
    assert code == 2 and "too long" in err
    # a read-only directory (root ignores modes)
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    code, _, err = run_cli(["--out", tmp_path / "k.toml"], capsys)
    assert code == 2 and "permission denied" in err


def test_a_lock_file_this_user_cannot_open_is_reported(tmp_path, capsys, monkeypatch):
    import filelock

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(filelock.FileLock, "acquire", denied)
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", *small_probe("Linear", precision=None)], capsys
    )
    assert code == 2 and "cannot open its lock file" in err and "remove the stale" in err
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.slow
def test_a_file_system_without_locks_is_a_warning(tmp_path, capsys, monkeypatch):
    import errno

    import filelock

    def unsupported(self, *a, **k):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(filelock.FileLock, "acquire", unsupported)
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", *small_probe("Linear")],
        capsys,
    )
    assert code == 0 and "does not do file locks" in err


@pytest.mark.slow
def test_a_symlink_at_out_is_written_through(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "link.toml").symlink_to(shared / "kernel-lock.toml")
    argv = ["--out", tmp_path / "link.toml", *small_probe("Linear")]
    assert run_cli(argv, capsys)[0] == 0
    assert (tmp_path / "link.toml").is_symlink() and kernel_lock.load(
        shared / "kernel-lock.toml"
    ).slots
    assert run_cli([*argv, "--force"], capsys)[0] == 0
    assert (tmp_path / "link.toml").is_symlink()


def test_a_device_at_out_is_never_replaced(tmp_path, capsys):
    (tmp_path / "dev.toml").symlink_to("/dev/null")
    code, _, err = run_cli(["--out", tmp_path / "dev.toml", "--force", "--slot", "Linear"], capsys)
    assert code == 2 and "character device" in err and "never replaced" in err
    assert Path("/dev/null").is_char_device()


def test_the_file_lock_beside_a_lock_is_ignored_by_git(tmp_path):
    from kernel_probe.probe.write import file_lock_path

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of kernel-probe")
    name = file_lock_path(ROOT / "kernel-lock.toml").name
    assert name == ".kernel-lock.toml.lock"
    for candidate in (name, file_lock_path(ROOT / "site.toml").name):
        done = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", candidate]
        )
        assert done.returncode == 0, f"{candidate} is not ignored by .gitignore"


@pytest.mark.parametrize("flag", ["--lock-timeout", "--timeout", "--import-timeout", "--reps"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "1e12", "abc"])
def test_numeric_options_are_finite_positive_and_bounded(tmp_path, capsys, flag, value):
    """--lock-timeout nan once never timed out (busy-polling), inf waited forever, -1 gave up at
    once (issue 34)."""
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "k.toml"), flag, value])
    assert exc.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.parametrize("field", ["timeout", "import_timeout", "lock_timeout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0])
def test_the_library_request_is_held_to_the_same_bounds(field, value):
    from kernel_probe.errors import UsageError
    from kernel_probe.probe.planning import ProbeRequest, plan

    with pytest.raises(UsageError, match="positive, finite"):
        plan(ProbeRequest(**{field: value}))


# ---- the command line as a typed request: every field filled, once (issue 40) --------------------
def test_every_request_field_comes_from_the_command_line_once():
    import dataclasses

    from kernel_probe import cli
    from kernel_probe.commands import probe as probe_cmd
    from kernel_probe.probe.planning import ProbeRequest

    parser = cli._base_parser("kernel-probe", "", "summary")
    probe_cmd.add_probe_arguments(parser)
    args = parser.parse_args(
        ["--reps", "7", "--force", "--deterministic", "--lock-timeout", "9", "--no-plugins"]
    )
    converted = {
        "out",
        "shapes",
        "slots",
        "pins",
        "prefers",
        "candidates",
        "plugins",
        "profiles_dirs",
    }
    converted |= {"check_only", "command", "declared", "model_check"}
    fields = {f.name for f in dataclasses.fields(ProbeRequest)}
    assert (
        set(probe_cmd.AS_PARSED) | converted == fields and not set(probe_cmd.AS_PARSED) & converted
    )
    assert all(hasattr(args, name) for name in probe_cmd.AS_PARSED)  # each is an option's own name
    request = probe_cmd.request_from(args)
    assert (request.reps, request.force, request.deterministic, request.lock_timeout) == (
        7,
        True,
        True,
        9.0,
    )
    assert request.plugins is False and request.check_only is False


@pytest.mark.slow
def test_diff_names_what_check_calls_stale(tmp_path, capsys, monkeypatch):
    """Issue 56: two locks probed at other shapes, another attention geometry and with liger
    present in one: `diff --exit-code` names each difference and exits 6; `--check` of one for
    the other's options is stale."""
    from kernel_probe.probe import planning

    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    probe_a = [*small_probe("LayerNorm", "Attention"), "--attention", "2x16x64"]
    probe_b = [*small_probe("LayerNorm", "Attention", shape="128x64"), "--attention", "2x16x96"]
    assert main([*probe_a, "--out", str(a)]) == 0
    installed = planning.installed_for
    with monkeypatch.context() as m:  # as on a machine where liger-kernel is not installed
        m.setattr(planning, "installed_for", lambda c: {**installed(c), "liger-kernel": ""})
        assert main([*probe_b, "--out", str(b)]) == 0
    assert kernel_lock.load(b).provenance["libraries"]["liger-kernel"] == ""
    capsys.readouterr()
    code, out, _ = run_cli(["diff", b, a, "--exit-code"], capsys)
    assert code == 6, out
    lines = " ".join(out.split())
    assert "options: it was probed with other options:" in lines
    assert "--shape: 128x64 -> 64x32" in lines and "--attention: 2x16x96 -> 2x16x64" in lines
    assert "libraries: liger-kernel is installed now" in lines
    code, out, _ = run_cli(["diff", b, a, "--json"], capsys)
    found = {d["what"]: d for d in json.loads(out)["probe"]}
    assert found["libraries"]["a"] == {"liger-kernel": ""}
    assert found["options"]["b"]["attention"] == "2x16x64"
    # --check of b with a's options: stale for the same reason (one comparison)
    code, _, err = run_cli([*probe_a, "--out", b, "--check"], capsys)
    assert code == 3 and "--attention: 2x16x96 -> 2x16x64" in " ".join(err.split())


def test_o96_attention_on_a_cpu_is_refused_within_seconds(tmp_path):
    """Issue 56: O96's attention on this CPU exited 1 after minutes; now exit 3 up front, in a
    fresh interpreter as a user runs it, naming the reason and the fix, nothing written."""
    out = tmp_path / "k.toml"
    argv = ["--slot", "Attention", "--attention", "16x64x40320:window=512", "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe", *argv], capture_output=True, text=True, cwd=ROOT
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 3, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "Attention at 16x64x40320:window=512 cannot be timed on this cpu" in err
    assert "fix: probe where the model trains (a GPU node)" in err and not out.exists()
    assert seconds < 60, seconds
