"""kernel_probe.isolation.worker: the process a candidate runs in, its progress messages, and what it
leaves behind when a library forks or the probe is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kernel_probe.isolation.worker import WorkerPool
from kernel_probe.probe import candidates as cands
from kernel_probe.probe.check import check_all


# ---- a library that forks, a probe that is killed (hostile input, issue 14) --------------------------------
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


# ---- progress while timing (issue 16, point 5) -------------------------------------------------------------
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
