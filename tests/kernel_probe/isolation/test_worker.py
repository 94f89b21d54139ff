"""kernel_probe.isolation.worker: the process a candidate runs in, its progress messages, and what
it leaves behind when a library forks or the probe is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kernel_probe import candidates as cands
from kernel_probe.isolation.protocol import ImportRequest, PingRequest
from kernel_probe.isolation.worker import WorkerPool
from kernel_probe.probe.check import check_all

LN = ImportRequest(target="torch.nn.LayerNorm")


# ---- a library that forks, a probe that is killed (hostile input, issue 14) ----------------------
@pytest.mark.slow
def test_a_forking_library_does_not_hang_the_probe_and_its_children_die(tmp_path, monkeypatch):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("KP_FORKS_PIDFILE", str(pidfile))
    offered = [cands.from_command_line("LayerNorm=kp_forks.ForkingLayerNorm")]
    start = time.perf_counter()
    with WorkerPool() as pool:
        reports = check_all(
            ["LayerNorm"], offered, "cpu", [("float32", "true")], workers=pool, timeout=60
        )
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
from kernel_probe import candidates as cands
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
@pytest.mark.skipif(
    sys.platform != "linux", reason="parent-death signals are Linux's (PR_SET_PDEATHSIG)"
)
def test_a_killed_probe_leaves_no_worker_and_no_grandchild(tmp_path):
    pidfile = tmp_path / "pids"
    env = {**os.environ, "KP_FORKS_PIDFILE": str(pidfile)}
    probe = subprocess.Popen(
        [sys.executable, "-c", KILLED_PROBE], stdout=subprocess.PIPE, text=True, env=env
    )
    worker = int(probe.stdout.readline())
    grandchildren = [int(x) for x in pidfile.read_text().split()]
    assert _alive(worker) and all(_alive(p) for p in grandchildren)
    probe.send_signal(signal.SIGKILL)
    probe.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(worker) or any(_alive(p) for p in grandchildren)):
        time.sleep(0.1)
    assert not _alive(worker), "the worker outlived the killed probe"
    assert not any(_alive(p) for p in grandchildren), (
        "a process the candidate spawned outlived the killed probe"
    )


# ---- progress while timing (issue 16, point 5) ---------------------------------------------------
@pytest.mark.slow
def test_worker_forwards_progress_before_the_reply():
    from kernel_probe.candidates import default_for
    from kernel_probe.isolation.protocol import TimeRequest, TimingProgressMessage
    from kernel_probe.isolation.worker import Worker

    seen: list[TimingProgressMessage] = []
    with Worker() as w:
        request = TimeRequest(
            candidate=default_for("LayerNorm").to_json(),
            slot="LayerNorm",
            device="cpu",
            shapes=("32x16", "64x16"),
            dtype="float32",
            regime="true",
            progress=True,
            options={"reps": 2, "warmup": 1, "min_seconds": 0.0},
        )
        reply = w.call(request, 120, on_progress=seen.append)
    assert [r["shape"] for r in reply.rows] == ["32x16", "64x16"]
    assert {(m.shape, m.phase) for m in seen} >= {
        ("32x16", "first call"),
        ("32x16", "warm-up"),
        ("64x16", "rep"),
    }
    assert all("copy_percent" not in r for r in reply.rows)  # no copy ceiling on a CPU


def _spy_writes(worker):
    """The request lines ``worker`` writes to its process from now on (its stdin wrapped)."""
    written: list[str] = []
    proc = worker._proc
    real = proc.stdin

    class Spy:
        def write(self, data):
            written.append(data.decode())
            return real.write(data)

        def flush(self):
            return real.flush()

        def close(self):
            return real.close()

    proc.stdin = Spy()
    return written


@pytest.mark.slow  # starts a worker (import torch)
def test_a_request_sent_ahead_is_answered_to_its_own_call_without_being_sent_again():
    from kernel_probe.isolation.protocol import ImportReply
    from kernel_probe.isolation.worker import Worker

    with Worker() as w:
        w.send_ahead(LN)
        assert w.started == 1  # started at once, its ping not yet read
        written = _spy_writes(w)
        reply = w.call(LN, 120)
        assert isinstance(reply, ImportReply) and reply.ok
        assert written == []  # the reply of the request written ahead
        again = w.call(LN, 120)
        assert again.ok and len(written) == 1 and w.started == 1


@pytest.mark.slow  # starts a worker (import torch)
def test_another_call_after_a_request_sent_ahead_gets_its_own_reply():
    from kernel_probe.isolation.protocol import PingReply
    from kernel_probe.isolation.worker import Worker

    with Worker() as w:
        w.send_ahead(ImportRequest(target="kp_no_such_module.Nope"))
        # the import's reply is read and dropped first: replies come in order
        reply = w.call(PingRequest(), 120)
        assert isinstance(reply, PingReply) and reply.pid == w._proc.pid
        imported = w.call(LN, 120)
        assert imported.ok


@pytest.mark.slow  # starts a worker (import torch)
def test_a_worker_that_dies_while_a_request_is_ahead_is_reported_and_replaced():
    from kernel_probe.isolation.child import kill_group
    from kernel_probe.isolation.worker import Worker, WorkerDied

    with Worker() as w:
        w.send_ahead(LN)
        kill_group(w._proc.pid)
        w._proc.wait()
        with pytest.raises(WorkerDied) as died:
            w.call(LN, 120)
        assert died.value.status == "crashed"
        # a fresh worker owes nothing
        assert w.call(LN, 120).ok
        assert w.started == 2


@pytest.mark.slow  # starts a worker (import torch)
def test_prepare_starts_each_named_library_worker_at_once_and_keeps_no_spare():
    from kernel_probe.candidates import default_for

    liger = [c for c in cands.registry([], entry_points=False)[0] if c.id == "liger.layer_norm"][0]
    pool = WorkerPool()
    try:
        pool.prepare(ahead=[default_for("LayerNorm"), liger])
        # liger's worker started; torch's own share one
        assert pool.fresh == 1 and pool._next is None
        with pool.worker_for(liger) as worker:
            assert worker._ahead is not None  # its first import is on its way
    finally:
        pool.close()
    assert pool.shared._proc is None


# ---- the working directory (issue 52) ---------------------------------------------------------
@pytest.mark.slow
def test_a_local_candidate_is_found_alone_in_the_working_directory(tmp_path, monkeypatch):
    """``--candidate LayerNorm=kp_here.Norm`` from the folder holding kp_here.py is checked; a
    sibling module it tries to import is not found there (only the named module is exposed)."""
    mark = tmp_path / "RAN-kp_sibling"
    (tmp_path / "kp_sibling.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    (tmp_path / "kp_here.py").write_text(
        "import torch\ntry:\n    import kp_sibling\nexcept ImportError:\n    pass\n"
        "class Norm(torch.nn.LayerNorm):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(
        str(tmp_path)
    )  # as `python -m kernel_probe` has it (never imported)
    offered = [cands.from_command_line("LayerNorm=kp_here.Norm")]
    assert cands.local_modules(offered) == ["kp_here"]
    reports = check_all(["LayerNorm"], offered, "cpu", [("float32", "true")], timeout=60)
    [r] = [r for r in reports["LayerNorm"] if r.id == "custom:kp_here.Norm"]
    assert r.status == "accepted", r.reasons
    assert not mark.exists()
