"""Hostile locks, libraries and files: one regression test (or more) per point of issue 14.

Every hostile input must fail fast, with a documented exit code, a message naming the file and the
field, nothing imported that the allow-list does not cover, and nothing half-written on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import KernelUnavailable, LockFormatError, LockWarning, TargetNotAllowed
from kernel_probe.isolation.worker import WorkerPool
from kernel_probe.probe import candidates as cands
from kernel_probe.probe.check import check_all

from .conftest import FAKES, MINIMAL_LOCK, ROOT, run_cli


def lock_text(**replace: str) -> str:
    text = MINIMAL_LOCK
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def write_lock(tmp_path: Path, text: str, name: str = "k.toml", seal: bool = True) -> Path:
    p = tmp_path / name
    if seal:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LockWarning)
            text = kernel_lock.loads(text, check_targets=False).sealed().dumps()
    p.write_text(text)
    return p


@pytest.fixture
def no_trust(monkeypatch):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)


# ---- 1: requires[].module ------------------------------------------------------------------------
@pytest.fixture
def canary(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "canarypkg"
    (pkg / "sub").mkdir(parents=True)
    flag = tmp_path / "canary-ran"
    (pkg / "__init__.py").write_text(f"open({str(flag)!r}, 'w').write('imported')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return flag


REQUIRES = 'kwargs = {{ eps = 1e-6 }}\nrequires = [{{ name = "no-such-dist", module = "{module}" }}]'


@pytest.mark.parametrize("module", ["canarypkg.sub", "this.x", "nosuchpkg.sub"])
def test_requirement_modules_are_allow_listed_and_never_imported(tmp_path, capsys, canary, no_trust, module):
    text = lock_text(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module=module)})
    path = write_lock(tmp_path, text)
    code, out, err = run_cli(["verify", path, "--json"], capsys)
    assert code == 5 and "requirement module" in err and "allow-list" in err, err
    assert json.loads(out)["error"]["exit_code"] == 5  # --json: the error as JSON on stdout, nothing else
    assert "Zen of Python" not in out + err and "Traceback" not in err
    assert not canary.exists()


def test_a_granted_requirement_module_is_looked_up_without_running_it(tmp_path, capsys, canary, no_trust):
    path = write_lock(tmp_path, lock_text(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module="canarypkg.sub")}))
    code, out, err = run_cli(["verify", path, "--trust", "canarypkg"], capsys)
    assert code == 0, err  # found on the search path (a source tree), its package code never ran
    assert not canary.exists()
    path = write_lock(tmp_path, lock_text(**{"kwargs = { eps = 1e-6 }": REQUIRES.format(module="nosuchpkg.sub")}))
    code, out, err = run_cli(["verify", path, "--trust", "nosuchpkg"], capsys)
    assert code == 3 and "no-such-dist" in err and "not installed" in err and "Traceback" not in err


# ---- 2: a library that forks, a probe that is killed -------------------------------------------------
@pytest.mark.slow
def test_a_forking_library_does_not_hang_the_probe_and_its_children_die(tmp_path, monkeypatch):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("KP_FORKS_PIDFILE", str(pidfile))
    offered = [cands.from_command_line("LayerNorm=kp_forks.ForkingLayerNorm")]
    start = time.perf_counter()
    with WorkerPool() as pool:
        reports = check_all(["LayerNorm"], offered, "cpu", [("float32", "true")], workers=pool, timeout=60)
    elapsed = time.perf_counter() - start
    [r] = [r for r in reports["LayerNorm"] if r.id == "custom:kp_forks.ForkingLayerNorm"]
    assert r.status == "accepted", r.reasons  # it computes the right thing; it just forks
    assert elapsed < 60
    grandchildren = [int(x) for x in pidfile.read_text().split()]
    assert grandchildren
    time.sleep(0.5)
    for pid in grandchildren:
        assert not _alive(pid), f"process {pid} a candidate spawned outlived the probe"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper counts as dead
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


KILLED_PROBE = r"""
import os, sys, time
from kernel_probe.probe import candidates as cands
from kernel_probe.probe.check import check_candidate
from kernel_probe.isolation.worker import WorkerPool
pool = WorkerPool()
cand = cands.from_command_line("LayerNorm=kp_forks.ForkingLayerNorm")
with pool.worker_for(cand) as w:
    check_candidate(cand, "LayerNorm", "cpu", [("float32", "true")], w, timeout=60)
    print(w._proc.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signals are Linux's (PR_SET_PDEATHSIG)")
def test_a_killed_probe_leaves_no_worker_and_no_grandchild(tmp_path):
    pidfile = tmp_path / "pids"
    env = {**os.environ, "KP_FORKS_PIDFILE": str(pidfile)}
    probe = subprocess.Popen([sys.executable, "-c", KILLED_PROBE], stdout=subprocess.PIPE, text=True, env=env)
    worker = int(probe.stdout.readline())
    grandchildren = [int(x) for x in pidfile.read_text().split()]
    assert _alive(worker) and all(_alive(p) for p in grandchildren)
    probe.send_signal(signal.SIGKILL)
    probe.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(worker) or any(_alive(p) for p in grandchildren)):
        time.sleep(0.1)
    assert not _alive(worker), "the worker outlived the killed probe"
    assert not any(_alive(p) for p in grandchildren), "a process the candidate spawned outlived the killed probe"


# ---- 3: __main__ and private components, sys.exit on import ------------------------------------------
@pytest.mark.parametrize("target", ["torch.utils.model_dump.__main__.X", "torch._C._nn.Thing", "torch.nn._reduction.X"])
def test_main_and_private_paths_are_refused_before_import(tmp_path, capsys, target):
    path = write_lock(tmp_path, lock_text(**{'target = "torch.nn.LayerNorm"': f'target = "{target}"'}), seal=False)
    code, out, err = run_cli(["verify", path], capsys)
    assert code == 5 and "private or __main__ component" in err and "usage" not in (out + err).lower()
    assert "torch.utils.model_dump.__main__" not in sys.modules


@pytest.mark.slow
def test_a_library_calling_sys_exit_on_import_does_not_end_the_caller(tmp_path, monkeypatch):
    (tmp_path / "kp_exits.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lock = kernel_lock.loads(
        lock_text(**{'target = "torch.nn.LayerNorm"': 'target = "kp_exits.Norm"'}),
        trust=["kp_exits"],
        emit_warnings=False,
    )
    with pytest.raises(KernelUnavailable, match=r"called sys.exit\(0\)"):
        lock.factory("LayerNorm", verify_environment=False)
    # in the probe's worker: a verdict, not a dead worker
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}")
    reports = check_all(
        ["LayerNorm"], [cands.from_command_line("LayerNorm=kp_exits.Norm")], "cpu", [("float32", "true")]
    )
    [r] = [r for r in reports["LayerNorm"] if r.id == "custom:kp_exits.Norm"]
    assert r.status == "crashed" and "SystemExit" in r.reasons[0]


# ---- 4: one candidate poisoning the next one's verdict --------------------------------------------
@pytest.mark.slow
def test_a_library_patching_torch_is_refused_and_cannot_poison_another(tmp_path, capsys):
    offered = [
        cands.from_command_line("LayerNorm=kp_poison.PoisonLayerNorm"),
        cands.from_command_line("LayerNorm=kp_affine.AffineIdentity"),
    ]
    candidates, _ = cands.registry(offered, entry_points=False)
    reports = {r.id: r for r in check_all(["LayerNorm"], candidates, "cpu", [("float32", "true")])["LayerNorm"]}
    poison = reports["custom:kp_poison.PoisonLayerNorm"]
    assert poison.status == "rejected" and "replaced torch's own torch.nn.functional.layer_norm" in poison.reasons[0]
    affine = reports["custom:kp_affine.AffineIdentity"]
    assert affine.status == "rejected" and "y error" in " ".join(affine.reasons)  # judged against the real reference
    assert reports["torch.layer_norm"].status == "accepted"
    # and --prefer cannot write it into a lock
    code, _, err = run_cli(
        [
            "--out",
            tmp_path / "k.toml",
            "--slot",
            "LayerNorm",
            "--precision",
            "32-true",
            "--shape",
            "64x32",
            "--reps",
            "2",
            "--candidate",
            "LayerNorm=kp_poison.PoisonLayerNorm",
            "--candidate",
            "LayerNorm=kp_affine.AffineIdentity",
            "--prefer",
            "LayerNorm=custom:kp_affine.AffineIdentity",
        ],
        capsys,
    )
    assert code != 0 and "rejected" in err and not (tmp_path / "k.toml").exists()


# ---- 5: the slot's semantics at verify, an empty environment, trust granted by the caller --------------
@pytest.mark.parametrize(
    "slot,target,words",
    [
        ("LayerNorm", "torch.nn.RMSNorm", "computes rms_norm, not layer_norm"),
        ("Linear", "torch.nn.Identity", "computes other: Identity, not linear"),
    ],
)
def test_verify_checks_the_class_against_the_slot(tmp_path, capsys, slot, target, words):
    default = {"LayerNorm": "torch.nn.LayerNorm", "Linear": "torch.nn.Linear"}[slot]
    text = MINIMAL_LOCK.replace(f"[slots.{slot}]\nimplementation", f"[slots.{slot}]\nimplementation", 1)
    head, _, tail = text.partition(f"[slots.{slot}]")
    tail = tail.replace(f'target = "{default}"', f'target = "{target}"', 1)
    path = write_lock(tmp_path, head + f"[slots.{slot}]" + tail)  # rehash-ed: the digest is intact
    code, _, err = run_cli(["verify", path, "--strict"], capsys)
    assert code == 5 and words in err, err


def test_strict_refuses_an_empty_environment(tmp_path, capsys):
    text = lock_text(**{'[environment]\ndevice-type = { value = "cpu", match = "exact" }\n': ""})
    path = write_lock(tmp_path, text)
    assert run_cli(["verify", path], capsys)[0] == 0  # matches any machine: allowed, but ...
    code, _, err = run_cli(["verify", path, "--strict"], capsys)
    assert code == 5 and "no [environment]: it would match any machine" in err


def test_a_locks_trusted_modules_only_ask(tmp_path, capsys, no_trust):
    text = lock_text(
        **{
            'created-by = "hand"': 'created-by = "hand"\ntrusted-modules = ["kp_zoo"]',
            'target = "torch.nn.LayerNorm"': 'target = "kp_zoo.norms.GoodLayerNorm"',
        }
    )
    path = write_lock(tmp_path, text)
    code, _, err = run_cli(["verify", path], capsys)
    assert code == 5 and "asks to trust (trusted-modules) but which was not granted" in err and "--trust kp_zoo" in err
    assert run_cli(["verify", path, "--trust", "kp_zoo"], capsys)[0] == 0
    os.environ["KERNEL_LOCK_TRUST"] = "kp_zoo"
    try:
        assert run_cli(["verify", path], capsys)[0] == 0
        assert kernel_lock.load(path).granted == ("kp_zoo",)
    finally:
        del os.environ["KERNEL_LOCK_TRUST"]
    with pytest.raises(TargetNotAllowed, match="not granted"):
        kernel_lock.load(path)
    assert run_cli(["show", path], capsys)[0] == 0  # printing a lock imports nothing: no trust needed


# ---- 6: inputs that hang or exhaust memory ---------------------------------------------------------
@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "pipe.toml"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "{fifo}"],
        ["verify", "{fifo}"],
        ["export", "{fifo}"],
        ["explain", "{fifo}", "LayerNorm"],
        ["profiles", "check", "{fifo}"],
        ["check-config", "{fifo}"],
        ["--profile", "{fifo}"],
        ["show", "/dev/zero"],
        ["check-config", "/dev/zero"],
        ["profiles", "check", "/dev/zero"],
    ],
)
def test_special_files_are_refused_at_once(tmp_path, capsys, fifo, argv):
    argv = [a.replace("{fifo}", str(fifo)) for a in argv]
    if argv[0] == "--profile":
        argv += ["--out", str(tmp_path / "k.toml")]
    start = time.perf_counter()
    code, _, err = run_cli(argv, capsys)
    assert time.perf_counter() - start < 20
    assert code == 5 and ("FIFO" in err or "character device" in err) and "not a regular file" in err, err


BOMB = textwrap.dedent("""\
    a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
    model: {layer_kernels: {LayerNorm: {_target_: torch.nn.LayerNorm, junk: *g}}}
""")


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path, capsys):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)
    assert len(BOMB) < 700
    start = time.perf_counter()
    code, _, err = run_cli(["check-config", p], capsys)
    assert code == 5 and "alias bomb" in err and time.perf_counter() - start < 20


def test_an_interpolation_fan_out_is_bounded(tmp_path, capsys):
    levels = ["a0: [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 7):
        levels.append(f"a{i}: [" + ", ".join([f"'${{model.a{i - 1}}}'"] * 10) + "]")
    model = "\n".join("  " + line for line in levels)
    p = tmp_path / "fan.yaml"
    p.write_text(
        f"model:\n{model}\n  layer_kernels:\n    LayerNorm: {{_target_: torch.nn.LayerNorm, junk: '${{model.a6}}'}}\n"
    )
    start = time.perf_counter()
    code, _, err = run_cli(["check-config", p], capsys)
    assert code == 5 and "references produces more than" in err and time.perf_counter() - start < 20


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


# ---- 7: unknown environment fields ------------------------------------------------------------------
def test_an_unknown_environment_field_is_reported_not_checked(tmp_path, capsys):
    text = lock_text(
        **{
            'device-type = { value = "cpu", match = "exact" }': 'device-type = { value = "cpu", match = "exact" }\nquantum-bits = { value = "42", match = "exact" }'
        }
    )
    path = write_lock(tmp_path, text)
    code, out, err = run_cli(["verify", path], capsys)
    assert code == 0, err
    assert "'quantum-bits' is unknown to this kernel_lock" in out and "not checked" in out


# ---- 8: markup and escape sequences in lock strings ---------------------------------------------------
@pytest.mark.parametrize(
    "value,shown",
    [
        ("[/bold] x", "[/bold] x"),
        ("[black on black]hidden", "[black on black]hidden"),
        ("\x1b[2J\x1b[31mred", "\\x1b[2J"),
    ],
)
@pytest.mark.parametrize("command", ["show", "explain", "diff", "verify"])
def test_strings_from_a_lock_are_printed_as_text(tmp_path, capsys, value, shown, command):
    escaped = value.replace("\x1b", "\\u001b")
    text = lock_text(
        **{
            'created-by = "hand"': f'created-by = "{escaped}"',
            'implementation = "torch.layer_norm"': f'implementation = "{escaped}"',
        }
    )
    path = write_lock(tmp_path, text)
    argv = {
        "show": ["show", path],
        "explain": ["explain", path, "LayerNorm"],
        "diff": ["diff", path, tmp_path / "b.toml"],
        "verify": ["verify", path],
    }[command]
    write_lock(tmp_path, MINIMAL_LOCK, "b.toml")
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "\x1b" not in out + err
    if command in ("show", "explain"):
        assert shown in out, out


# ---- 9: exit codes and unvalidated values -----------------------------------------------------------
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


@pytest.mark.parametrize(
    "argv,code",
    [
        (["check", "--timeout", "nan"], 2),
        (["check", "--timeout", "-1"], 2),
        (["check", "--import-timeout", "inf"], 2),
        (["--out", ""], 2),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, argv, code):
    assert run_cli(argv, capsys)[0] == code


def test_out_problems_are_usage_errors(tmp_path, capsys, monkeypatch):
    long_name = "x" * 300 + ".toml"
    code, _, err = run_cli(["--out", tmp_path / long_name], capsys)
    assert code == 2 and "too long" in err
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # a read-only directory (root ignores modes)
    code, _, err = run_cli(["--out", tmp_path / "k.toml"], capsys)
    assert code == 2 and "permission denied" in err


@pytest.mark.parametrize(
    "candidate,words",
    [
        ('id = "torch.layer_norm"\nslots = ["LayerNorm"]\ntarget = "site.Norm"', "built-in candidate's id"),
        ('id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nargs = 3', "expected a list"),
        (
            'id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\nkwargs = { eps = [1] }',
            "expected a string, a finite number",
        ),
        ('id = "site.x"\nslots = ["LayerNorm"]\ntarget = "site.Norm"\ntwin-kwargs = 1', "expected a table"),
    ],
)
def test_profile_candidate_fields_are_validated(tmp_path, capsys, candidate, words):
    p = tmp_path / "site.toml"
    p.write_text(f'profile-version = "1"\nname = "site"\n[[candidate]]\n{candidate}\n')
    code, _, err = run_cli(["profiles", "check", p], capsys)
    assert code == 5 and words in err and "candidate[0]" in err, err


def test_one_broken_profile_does_not_hide_the_others(tmp_path, capsys, monkeypatch):
    (tmp_path / "broken.toml").write_text("profile-version = = 1\n")
    monkeypatch.setenv("KERNEL_PROBE_PROFILES", str(tmp_path))
    code, out, err = run_cli(["profiles", "show", "cpu"], capsys)
    assert code == 0 and "cpu" in out
    code, out, err = run_cli(["profiles", "list"], capsys)
    assert code == 0 and "broken profile" in err and "broken.toml" in err
    assert run_cli(["--profile", "broken", "--out", tmp_path / "k.toml"], capsys)[0] == 5


def test_config_keys_that_are_not_names(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(
        "model:\n  layer_kernels:\n    1: {_target_: torch.nn.LayerNorm}\n    null: {_target_: torch.nn.Linear}\n"
    )
    code, out, err = run_cli(["check-config", p], capsys)
    assert code == 5 and "is a int, not a name" in out and "Traceback" not in err


# ---- 10: files ------------------------------------------------------------------------------------------
def test_a_lock_file_this_user_cannot_open_is_reported(tmp_path, capsys, monkeypatch):
    import filelock

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(filelock.FileLock, "acquire", denied)
    code, _, err = run_cli(
        ["--out", tmp_path / "k.toml", "--slot", "Linear", "--shape", "64x32", "--reps", "2"], capsys
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
        ["--out", tmp_path / "k.toml", "--slot", "Linear", "--precision", "32-true", "--shape", "64x32", "--reps", "2"],
        capsys,
    )
    assert code == 0 and "does not do file locks" in err


@pytest.mark.slow
def test_a_symlink_at_out_is_written_through(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "link.toml").symlink_to(shared / "kernel-lock.toml")
    argv = [
        "--out",
        tmp_path / "link.toml",
        "--slot",
        "Linear",
        "--precision",
        "32-true",
        "--shape",
        "64x32",
        "--reps",
        "2",
    ]
    assert run_cli(argv, capsys)[0] == 0
    assert (tmp_path / "link.toml").is_symlink() and kernel_lock.load(shared / "kernel-lock.toml").slots
    assert run_cli([*argv, "--force"], capsys)[0] == 0
    assert (tmp_path / "link.toml").is_symlink()


def test_a_device_at_out_is_never_replaced(tmp_path, capsys):
    (tmp_path / "dev.toml").symlink_to("/dev/null")
    code, _, err = run_cli(["--out", tmp_path / "dev.toml", "--force", "--slot", "Linear"], capsys)
    assert code == 2 and "character device" in err and "never replaced" in err
    assert Path("/dev/null").is_char_device()


def test_documented_torch_load_calls_pass_weights_only():
    import re

    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for call in re.findall(r"torch\.load\([^)]*\)", doc.read_text()):
            assert "weights_only=" in call, (doc.name, call)
    assert FAKES.is_dir()
