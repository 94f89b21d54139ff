"""kernel_lock.launch: the one child launcher. A ``json.py``, ``tempfile.py`` and
``sitecustomize.py`` planted in the working directory run in no child (issue 34, point 2); nor does
``kp5backend.py``, declared a ``torch.backends`` entry point by a dist-info there (issue 52)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lock.launch import cwd_like, python_argv, pythonpath_roots, run, start, trusted_roots

PLANTED = ("json", "tempfile", "sitecustomize", "kp_local_only", "kp_other", "kp5backend")


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Path:
    """A working directory with modules that, if imported, leave a file saying so."""
    work = tmp_path / "work"
    work.mkdir()
    for name in PLANTED:
        (work / f"{name}.py").write_text(
            f"open({str(tmp_path / ('RAN-' + name))!r}, 'w').close()\n"
            + ('VERDICT = "forged"\n' if name == "kp_local_only" else "raise SystemExit(0)\n")
        )
    info = work / "kp5backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kp5backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nkp5 = kp5backend:init\n")
    monkeypatch.chdir(work)
    return tmp_path


def ran(root: Path) -> list[str]:
    return sorted(p.name[4:] for p in root.glob("RAN-*"))


def run_code(code: str, **kw) -> subprocess.CompletedProcess[str]:
    proc = start(python_argv(code, **kw), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def test_the_working_directory_is_never_on_the_childs_path_nor_runs_in_it(planted):
    code = (
        "import json, tempfile, sys, os; print(json.dumps([sys.path, json.__file__, "
        "sys.flags.isolated]))"
    )
    done = run_code(code, roots=["", ".", os.getcwd(), str(planted / "root")])
    assert done.returncode == 0, done.stderr
    path, json_file, isolated = json.loads(done.stdout)
    assert isolated == 1 and ran(planted) == []
    assert "" not in path and os.getcwd() not in path and path[0] == str(planted / "root")
    assert not json_file.startswith(os.getcwd())


def test_a_named_local_module_is_found_alone_last_and_no_distribution_there(planted):
    """Issue 52: cwd last on ``sys.path`` stopped shadowing, not discovery; the finder exposes
    only the module named (an installed one still wins), and lists no dist-info of the folder."""
    code = (
        "import json, tempfile, importlib.metadata as md, kp_local_only\n"
        "try:\n    import kp_other\nexcept ImportError:\n    kp_other = None\n"
        "eps = [e.name for e in md.entry_points(group='torch.backends')]\n"
        "names = [d.metadata['Name'] or '' for d in md.distributions()]\n"
        "print(json.dumps([kp_local_only.VERDICT, kp_other is None, eps, "
        "[n for n in names if n.startswith('kp')]]))"
    )
    done = run_code(code, local=["kp_local_only", "json", "not a name"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["forged", True, [], []]
    assert ran(planted) == ["kp_local_only"]


def test_children_start_with_device_backend_autoload_off(planted, monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
    done = run_code("import os; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])")
    assert done.stdout.strip() == "0"


@pytest.mark.slow
def test_torch_imported_in_a_child_runs_no_backend_of_the_working_directory(planted):
    done = run_code("import torch", local=["kp_local_only"])
    assert done.returncode == 0, done.stderr
    assert ran(planted) == []


def test_pythonpath_is_read_by_the_launcher_not_by_the_interpreter(planted, monkeypatch):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(["", ".", str(planted / "lib"), os.getcwd()]),
    }
    assert pythonpath_roots(env) == [str(planted / "lib")]
    # -I: no PYTHON* variable is read
    monkeypatch.setenv("PYTHONSTARTUP", str(Path.cwd() / "json.py"))
    done = run_code("import json", roots=pythonpath_roots(env))
    assert done.returncode == 0 and ran(planted) == []


def test_trusted_roots_spellings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cwd_like("") and cwd_like(".") and cwd_like(str(tmp_path)) and not cwd_like("/usr")
    assert trusted_roots(["", "rel", "/a", "/a"]) == [str(tmp_path / "rel"), "/a"]


def test_the_child_leads_its_own_session(planted):
    done = run_code("import os; print(os.getsid(0) == os.getpid())")
    assert done.stdout.strip() == "True"


# ---- every real child: the isolation BOOT (worker, env's import checks, check-config's children)
# and the confirming child of the job-start check and rehash
def test_a_boot_child_runs_none_of_them(planted):
    from kernel_probe.isolation.child import run_function

    result = run_function("os.path", "basename", "/a/b", timeout=60)
    assert result.ok and result.value == "b", result
    assert ran(planted) == []


@pytest.mark.slow
def test_the_worker_runs_none_of_them(planted):
    from kernel_probe.isolation.worker import PING, Worker

    with Worker() as worker:
        worker.call(PING)  # a real worker, up and answering its ping
        assert worker.started == 1
    assert ran(planted) == []


@pytest.mark.slow
def test_the_confirming_child_runs_none_of_them_and_its_verdict_stands(planted, minimal_lock_text):
    """A json.py printing a forged verdict once made `--check` exit 0 while `verify` exited 3."""
    from kernel_lock import loads
    from kernel_lock.launch import child_verdicts

    lock = loads(
        minimal_lock_text.replace("torch.nn.LayerNorm", "torch.nn.Identity"),
        path="L.toml",
        emit_warnings=False,
    )
    verdicts = child_verdicts(
        lock, "training", {"LayerNorm": "its class is judged by importing it"}
    )
    assert ran(planted) == []
    verdict = verdicts["LayerNorm"]  # the child's own refusal of the lock, not the forged "fine"
    assert verdict is not None and (verdict["exit_code"], verdict["key"]) == (
        5,
        "slots.LayerNorm.target",
    )
    assert "'torch.nn.Identity' computes other: Identity, not layer_norm" in verdict["problem"]
    assert sys.modules.get("kp_local_only") is None


@pytest.mark.slow
def test_the_timing_plot_benchmark_probes_through_the_launcher(planted):
    """Issue 52: `benchmarks/timing_plot.py --run` started `python -m kernel_probe` itself, which
    put the working directory first on its path and ran a json.py there."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "timing_plot.py"
    spec = importlib.util.spec_from_file_location("kp_timing_plot", path)
    assert spec is not None and spec.loader is not None
    timing_plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timing_plot)
    result = timing_plot.run_probe(["64x32"], "32-true")
    assert ran(planted) == [] and result["shapes"] == ["64x32"]
    assert (
        result["machine"]["command"]
        == "kernel-probe --force --json --precision 32-true --shape 64x32"
    )


@pytest.mark.slow
def test_the_confirming_child_finds_a_local_target_alone(planted, minimal_lock_text, monkeypatch):
    """A caller with its working directory on its path (``python -m``) resolves a slot whose class
    lives there: the child finds that module, and no other module of the folder."""
    from kernel_lock import loads
    from kernel_lock.launch import child_verdicts

    Path("kp_local_norm.py").write_text(
        "import torch\ntry:\n    import kp_other\nexcept ImportError:\n    pass\n"
        "class Norm(torch.nn.LayerNorm):\n    pass\n"
    )
    monkeypatch.syspath_prepend("")
    text = minimal_lock_text.replace(
        'target = "torch.nn.LayerNorm"', 'target = "kp_local_norm.Norm"'
    )
    assert "kp_local_norm.Norm" in text
    lock = loads(text, path="L.toml", emit_warnings=False, trust=["kp_local_norm"])
    verdicts = child_verdicts(
        lock, "training", {"LayerNorm": "its class is judged by importing it"}
    )
    assert ran(planted) == []  # kp_other (and every other planted module) never ran
    verdict = verdicts["LayerNorm"]
    assert verdict is None, verdict  # built: found, and kp_other was not


# ---- run: start, wait within a time limit, kill the session after ------------------------------
def _gone(pid: int, wait: float = 5.0) -> bool:
    """The process has ended (or is a zombie of another parent) within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_run_starts_in_the_folder_given_and_returns_what_it_captured(tmp_path):
    code = "import os, sys; print(os.getcwd()); print(sys.stdin.read(), file=sys.stderr)"
    done = run([sys.executable, "-c", code], cwd=tmp_path, input="asked", timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr.strip()) == (
        0,
        str(tmp_path),
        "asked",
    )
    quiet = run([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.DEVNULL, timeout=60)
    assert quiet.stdout == "" and quiet.stderr.strip() == ""
    with pytest.raises(ValueError, match="captures output itself"):
        run([sys.executable, "-c", "pass"], stderr=subprocess.PIPE)


# a child that leaves a grandchild in its session, says it got SIGTERM, and waits to be killed
TERMED = """
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
def term(*_):
    print("SIGTERM", flush=True)
signal.signal(signal.SIGTERM, term)
open(sys.argv[1], "w").write(str(pid))
time.sleep(600)
"""


def test_run_at_its_limit_terms_then_kills_the_whole_session(tmp_path):
    out = tmp_path / "out"
    t0 = time.monotonic()
    with open(out, "wb") as stdout, pytest.raises(subprocess.TimeoutExpired):
        run(
            [sys.executable, "-c", TERMED, str(tmp_path / "pid")],
            timeout=1.5,  # its handler is set within 0.1 s of the start (python -c, no imports)
            grace=0.5,
            stdout=stdout,
        )
    assert time.monotonic() - t0 < 30
    assert out.read_text() == "SIGTERM\n" and _gone(int((tmp_path / "pid").read_text()))


def test_run_interrupted_kills_the_whole_session(tmp_path):
    pid_file = tmp_path / "pid"

    def interrupt(*_):  # once the child has forked: then its grandchild is there to be killed
        if pid_file.exists() and pid_file.read_text():
            raise KeyboardInterrupt
        signal.setitimer(signal.ITIMER_REAL, 0.1)

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(KeyboardInterrupt):
            run([sys.executable, "-c", TERMED, str(pid_file)], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _gone(int(pid_file.read_text()))
