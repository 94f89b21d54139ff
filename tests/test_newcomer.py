"""A newcomer's first hour (issue 16): arguments checked before any work, a lock's own mode, output
that reads at 80 columns and in logs, progress on long timings, and the smaller frictions.

Points 1 (numpy) and 6 (profiles as package data) have their tests in test_distributed.py and
test_profile_install.py; the exit-code table and lock-format keys in test_lock_docs.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess

import pytest

from .conftest import MINIMAL_LOCK, ROOT, run_cli

LONG_ID = "custom:kp_zoo.norms.GoodLayerNorm"


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if the probe starts any worker: the argument must be refused before any work."""
    from kernel_probe.isolation import worker

    def refuse(*_a, **_k):
        raise AssertionError("a worker was started: the argument should have been refused before any work")

    monkeypatch.setattr(worker.WorkerPool, "__init__", refuse)
    monkeypatch.setattr(worker.Worker, "__init__", refuse)


# ---- 2. --pin / --prefer checked before the probe -----------------------------------------------------
@pytest.mark.parametrize("flag", ["--pin", "--prefer"])
def test_unknown_id_is_a_usage_error_naming_its_own_flag(tmp_path, capsys, no_workers, flag):
    code, out, err = run_cli(["--out", tmp_path / "k.toml", flag, "RMSNorm=x"], capsys)
    assert code == 2
    assert f"{flag} RMSNorm=x" in err and "not a candidate for RMSNorm" in err and "torch.rms_norm" in err
    other = "--prefer" if flag == "--pin" else "--pin"
    assert other not in err.split("fix:")[0]
    assert not (tmp_path / "k.toml").exists()


@pytest.mark.parametrize("flag", ["--pin", "--prefer"])
def test_unavailable_pin_exits_3_before_any_work(tmp_path, capsys, no_workers, flag):
    code, out, err = run_cli(["--out", tmp_path / "k.toml", flag, "RMSNorm=quack.rms_norm"], capsys)
    assert code == 3  # kernel_lock.EXIT_CODES[3]: a pinned kernel cannot be used here
    assert f"{flag} RMSNorm=quack.rms_norm" in err and "unavailable" in err and "this device is cpu" in err
    assert not (tmp_path / "k.toml").exists()


def test_pin_of_a_slot_not_probed_is_a_usage_error(tmp_path, capsys, no_workers):
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", "--slot", "LayerNorm", "--pin", "RMSNorm=torch.rms_norm"], capsys
    )
    assert code == 2 and "--slot limits this probe to LayerNorm" in err


def test_compiled_pin_on_cpu_says_how(tmp_path, capsys, no_workers):
    code, _, err = run_cli(["--out", tmp_path / "k.toml", "--pin", "LayerNorm=torch.compile.layer_norm"], capsys)
    assert code == 3 and "--with-compile" in err


def test_choice_errors_name_the_flag_and_spell_it_right():
    from kernel_probe.errors import ForcedUnusable
    from kernel_probe.probe.choose import choose
    from kernel_probe.probe.report import Report

    reports = [
        Report("torch.rms_norm", "torch.nn.RMSNorm", "RMSNorm", "rms_norm", "cpu", "accepted"),
        Report("liger.rms_norm", "x.Y", "RMSNorm", "rms_norm", "cpu", "rejected", ["too wrong"]),
    ]
    for kw, flag, word in (
        ({"pin": "liger.rms_norm"}, "--pin", "pinned"),
        ({"prefer": "liger.rms_norm"}, "--prefer", "preferred"),
    ):
        with pytest.raises(ForcedUnusable) as exc:
            choose("RMSNorm", reports, {}, ["8x8"], "float32", "torch.rms_norm", **kw)
        text = str(exc.value)
        assert f"{flag} RMSNorm=liger.rms_norm" in text and f"a {word} kernel" in text and exc.value.exit_code == 3
        assert "pinn " not in text and "preferr " not in text
    with pytest.raises(ForcedUnusable, match="profile lumi-g pin RMSNorm=liger.rms_norm"):
        choose(
            "RMSNorm", reports, {}, ["8x8"], "float32", "torch.rms_norm", pin="liger.rms_norm", origin="profile lumi-g"
        )


# ---- 3. a lock's own mode -----------------------------------------------------------------------------------
@pytest.fixture
def inference_lock(tmp_path):
    import kernel_lock

    with contextlib.redirect_stderr(io.StringIO()):
        lock = kernel_lock.loads(
            MINIMAL_LOCK.replace('created-by = "hand"', 'created-by = "hand"\nmode = "inference"'), emit_warnings=False
        )
    path = tmp_path / "kernel-lock.inference.toml"
    lock.sealed().dump(path)
    return path


def test_verify_and_export_follow_the_locks_mode(inference_lock, capsys):
    code, out, err = run_cli(["verify", inference_lock], capsys)
    assert code == 0, err
    assert "(inference mode)" in out
    code, out, err = run_cli(["verify", inference_lock, "--json"], capsys)
    assert code == 0 and json.loads(out)["mode"] == "inference"
    code, out, err = run_cli(["export", inference_lock], capsys)
    assert code == 0 and "(inference mode)" in out and "torch.nn.LayerNorm" in out


def test_training_asked_of_an_inference_lock_says_so_the_right_way_round(inference_lock, capsys):
    code, out, err = run_cli(["verify", inference_lock, "--mode", "training"], capsys)
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


# ---- 4. output in logs and at 80 columns ----------------------------------------------------------------------
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
                "--slot",
                "LayerNorm",
                "--shape",
                "96x64",
                "--reps",
                "3",
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
    table = lines[lines.index("LayerNorm") + 1 : lines.index("LayerNorm") + 8]
    assert max(len(line.rstrip()) for line in table) <= 80 or LONG_ID in "".join(table)


def test_probe_in_a_log_reports_progress_per_candidate_shape_and_rep(logged_probe):
    _, (_, _, err) = logged_probe
    assert "checking LayerNorm: torch.layer_norm (1/" in err
    assert "timing LayerNorm: torch.layer_norm at 96x64 (shape 1/1): rep 3/3" in err


def test_explain_and_show_at_80_columns(logged_probe, monkeypatch):
    path, _ = logged_probe
    for argv in (["explain", path, "LayerNorm"], ["show", path]):
        code, out, err = _run_logged(argv, monkeypatch)
        assert code == 0, err
        assert "…" not in out, out
    code, out, _ = _run_logged(["explain", path, "LayerNorm"], monkeypatch)
    timing = out[out.index("timings") :]
    assert any(line.startswith("torch.layer_norm ") and "96x64" in line for line in timing.splitlines())
    assert "GB/s" not in timing and "bf16 mixed" in timing


def test_wide_table_is_printed_wider_rather_than_cut(monkeypatch):
    from kernel_probe import output

    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        output.reset()
        t = output.table("T")
        t.add_column("id", no_wrap=True)
        t.add_column("note")
        t.add_row("x" * 70 + ".end", "words that may wrap at spaces but never inside 'a_very_long_word_indeed'")
        output.print_table(t)
    text = buf.getvalue()
    assert "x" * 70 + ".end" in text and "'a_very_long_word_indeed'" in text and "…" not in text


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--json", "--pin", "RMSNorm=nope"], 2),
        (["--json", "--precision", "fp8"], 2),
        (["verify", "/no/such/lock.toml", "--json"], 5),
        (["explain", "/no/such/lock.toml", "Layernorm", "--json"], 2),
    ],
)
def test_json_errors_are_json_on_stdout(argv, code, capsys, no_workers):
    got, out, err = run_cli(argv, capsys)
    assert got == code
    data = json.loads(out)
    assert data["ok"] is False and data["error"]["exit_code"] == code and data["error"]["problem"]
    assert err.strip()  # and the message for a person on stderr


# ---- 5. progress and a warning for GPU-sized shapes on a CPU --------------------------------------------------
def test_gpu_sized_shapes_on_a_cpu_are_warned_about():
    from kernel_probe.probe.planning import large_shape_warning

    text = large_shape_warning("cpu", ["40320x1024", "542080x1024"], 5)
    assert "40320x1024, 542080x1024 are GPU-sized shapes" in text and "2048x1024" in text and "--reps" in text
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


def test_timing_progress_estimates_what_is_left():
    from kernel_probe.commands.probe import TimingProgress
    from kernel_probe.probe.timing import progress_message

    shown: list[str] = []
    p = TimingProgress("timing LayerNorm: torch.layer_norm", ["1000x100", "4000x100"], shown.append, every=3600)
    p(progress_message("1000x100", 0, 2, "first call", 1, 1, 0.5))
    p(progress_message("1000x100", 0, 2, "rep", 1, 5, 1.0))  # rate-limited: same shape, not the last
    p(progress_message("1000x100", 0, 2, "rep", 5, 5, 3.0))
    assert len(shown) == 2
    assert "first call 1/1" in shown[0]
    # 3 s over 6 calls: 0.5 s per call; the next shape is 4x the elements: 4 x 6 calls x 0.5 s = 12 s
    assert "rep 5/5, 0.5 s per call, about 12 s for the shapes after it" in shown[1]
    mid = p.text(progress_message("4000x100", 1, 2, "rep", 2, 5, 6.0))
    assert "rep 2/5, 2 s per call, about 6 s left at this shape" in mid


@pytest.mark.slow
def test_worker_forwards_progress_before_the_reply():
    from kernel_probe.isolation.protocol import TimeRequest, TimingProgressMessage
    from kernel_probe.isolation.worker import Worker
    from kernel_probe.probe.candidates import default_for

    seen: list[TimingProgressMessage] = []
    with Worker() as w:
        reply = w.call(
            TimeRequest(
                candidate=default_for("LayerNorm"),
                slot="LayerNorm",
                device="cpu",
                shapes=("32x16", "64x16"),
                dtype="float32",
                regime="true",
                progress=True,
                options={"reps": 2, "warmup": 1, "min_seconds": 0.0},
            ),
            120,
            on_progress=seen.append,
        )
    assert [r["shape"] for r in reply.rows] == ["32x16", "64x16"]
    assert {(m.shape, m.phase) for m in seen} >= {("32x16", "first call"), ("32x16", "warm-up"), ("64x16", "rep")}
    assert all("copy_percent" not in r for r in reply.rows)  # no copy ceiling on a CPU


# ---- 7. the smaller frictions ---------------------------------------------------------------------------------------
def test_help_states_the_real_defaults(capsys):
    from kernel_probe.probe.planning import DEFAULT_REPS, DEFAULT_SHAPES

    code, out, _ = run_cli(["--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and f"{DEFAULT_SHAPES['cpu'][0]} on CPU" in flat and "4096x1024" not in flat
    assert f"{DEFAULT_REPS['cpu']} on CPU" in flat


def test_lock_commands_default_to_KERNEL_LOCK(lock_file, capsys, monkeypatch):
    monkeypatch.setenv("KERNEL_LOCK", str(lock_file))
    monkeypatch.chdir(lock_file.parent.parent)  # no ./kernel-lock.toml here
    for argv in (["show"], ["explain", "LayerNorm"], ["rehash"], ["verify"]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0, (argv, err)
        assert str(lock_file) in out + err or argv == ["explain", "LayerNorm"], argv
    code, out, _ = run_cli(["explain", "LayerNorm"], capsys)
    assert "LayerNorm -> torch.layer_norm (torch.nn.LayerNorm)" in out  # the $KERNEL_LOCK file's slot


def test_explain_with_a_bad_slot_is_a_usage_error(lock_file, capsys):
    code, _, err = run_cli(["explain", lock_file, "Layernorm"], capsys)
    assert code == 2 and "did you mean 'LayerNorm'" in err
    code, _, err = run_cli(["explain", lock_file, "LayerNorm", "extra"], capsys)
    assert code == 2


def test_install_hint_names_the_library_the_slot_needs(tmp_path):
    import kernel_lock

    text = MINIMAL_LOCK.replace(
        '''implementation = "torch.rms_norm"
target = "torch.nn.RMSNorm"''',
        """implementation = "fast.rms_norm"
target = "kp_not_installed.norms.RMSNorm"
requires = [{ name = "kp-not-installed", specifier = ">=1.2", module = "kp_not_installed" }]""",
    )
    with contextlib.redirect_stderr(io.StringIO()):
        lock = kernel_lock.loads(text, emit_warnings=False)
    with pytest.raises(kernel_lock.KernelUnavailable) as exc:
        lock.factory("RMSNorm", verify_environment=False)
    assert "pip install 'kp-not-installed>=1.2'" in exc.value.fix and "kernel-probe[liger]" not in exc.value.fix
    assert "--mode inference" in exc.value.fix


def test_the_file_lock_beside_a_lock_is_ignored_by_git(tmp_path):
    from kernel_probe.probe.write import file_lock_path

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of kernel-probe")
    name = file_lock_path(ROOT / "kernel-lock.toml").name
    assert name == ".kernel-lock.toml.lock"
    for candidate in (name, file_lock_path(ROOT / "site.toml").name):
        done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", candidate])
        assert done.returncode == 0, f"{candidate} is not ignored by .gitignore"


def test_readme_says_what_the_anemoi_install_prints():
    readme = (ROOT / "README.md").read_text()
    assert "`pip check` will complain" not in readme and "resolver" in readme


def test_no_command_writes_a_lock_file_lock_into_the_cwd_on_failure(tmp_path, capsys, monkeypatch, no_workers):
    monkeypatch.chdir(tmp_path)
    run_cli(["--pin", "RMSNorm=nope"], capsys)
    assert sorted(os.listdir(tmp_path)) == []
