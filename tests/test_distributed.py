"""Many ranks, one lock: kernel_lock.distributed.check_ranks on 4 real processes (gloo, this CPU).

The 4 processes are started once and run every scenario in turn (one process group, one torch import
per process), each rank writing what it saw; the tests then read the scenarios one by one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import LockWarning, RanksDisagree
from kernel_lock.distributed import _ranks_text, check_ranks, judge, local_report

from .conftest import MINIMAL_LOCK, ROOT

WORLD = 4
HOST = socket.gethostname()

WORKER = r'''
import datetime, json, sys
import torch.distributed as dist
import kernel_lock
from kernel_lock import fingerprint
from kernel_lock.distributed import check_ranks

rank, world, init, plan_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
here = fingerprint.current()
results = {}
for scenario in json.load(open(plan_path)):
    mine = scenario["ranks"].get(str(rank), {})
    lock = kernel_lock.load(mine.get("lock", scenario["lock"]), emit_warnings=False)
    if mine.get("crash"):
        def current(*a, **k):
            raise RuntimeError("NVML exploded")
    else:
        facts = {**here, **mine.get("current", {})}
        def current(*a, facts=facts, **k):
            return dict(facts)
    fingerprint.current = current  # what lock.verify() reads on this rank
    try:
        check_ranks(lock)
        results[scenario["name"]] = {"ok": True}
    except kernel_lock.RanksDisagree as exc:
        results[scenario["name"]] = {"ok": False, "type": "RanksDisagree", "message": str(exc), "ranks": exc.ranks}
    except Exception as exc:
        results[scenario["name"]] = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
dist.destroy_process_group()
open(out_path, "w").write(json.dumps(results))
'''


def _sealed(text: str) -> kernel_lock.KernelLock:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)
        return kernel_lock.loads(text).sealed()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict[str, dict]]:
    tmp = tmp_path_factory.mktemp("ranks")
    same, other = tmp / "kernel-lock.toml", tmp / "other-lock.toml"
    _sealed(MINIMAL_LOCK).dump(same)
    _sealed(MINIMAL_LOCK.replace("kwargs = { bias = false }", "kwargs = { bias = true }")).dump(other)
    plan = [
        {"name": "agree", "lock": str(same), "ranks": {}},
        {"name": "rank 2 holds another lock", "lock": str(same), "ranks": {"2": {"lock": str(other)}}},
        {"name": "rank 0 holds another lock", "lock": str(same), "ranks": {"0": {"lock": str(other)}}},
        {"name": "rank 3 is another machine", "lock": str(same), "ranks": {"3": {"current": {"device-type": "cuda"}}}},
        {"name": "rank 1 fails to check", "lock": str(same), "ranks": {"1": {"crash": True}}},
        {"name": "both", "lock": str(same),
         "ranks": {"1": {"lock": str(other)}, "2": {"current": {"device-type": "rocm"}}}},
    ]  # fmt: skip
    (tmp / "plan.json").write_text(json.dumps(plan))
    script = tmp / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp / 'rendezvous'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), init, str(tmp / "plan.json"), str(tmp / f"{r}.json")],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)
    ]  # fmt: skip
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])  # a hung collective fails the test, never hangs it
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{log}"
    results = {r: json.loads((tmp / f"{r}.json").read_text()) for r in range(WORLD)}
    assert all(set(results[r]) == {s["name"] for s in plan} for r in results)
    return results


def _all_raise(ranks, scenario: str) -> str:
    """Every rank raised RanksDisagree with the same message; return it."""
    seen = [ranks[r][scenario] for r in range(WORLD)]
    assert all(s["ok"] is False and s["type"] == "RanksDisagree" for s in seen), seen
    assert len({s["message"] for s in seen}) == 1 and len({tuple(s["ranks"]) for s in seen}) == 1
    return seen[0]["message"]


def test_ranks_that_agree_go_on(ranks):
    assert [ranks[r]["agree"] for r in range(WORLD)] == [{"ok": True}] * WORLD


def test_a_rank_with_another_lock_stops_every_rank(ranks):
    msg = _all_raise(ranks, "rank 2 holds another lock")
    assert ranks[0]["rank 2 holds another lock"]["ranks"] == [2]
    assert "3 rank(s) (0-1, 3) hold lock sha256:" in msg and "1 rank(s) hold a different lock" in msg
    assert f"rank 2 on {HOST}: sha256:" in msg and "other-lock.toml" in msg
    assert "rank 0 on" not in msg and "same lock file" in msg


def test_the_odd_rank_is_named_even_when_it_is_rank_0(ranks):
    msg = _all_raise(ranks, "rank 0 holds another lock")
    assert ranks[3]["rank 0 holds another lock"]["ranks"] == [0]
    assert "(1-3) hold lock" in msg and f"rank 0 on {HOST}" in msg


def test_a_rank_whose_machine_does_not_match_stops_every_rank(ranks):
    msg = _all_raise(ranks, "rank 3 is another machine")
    assert ranks[1]["rank 3 is another machine"]["ranks"] == [3]
    assert "1 rank(s) run on a machine that does not match" in msg and f"rank 3 on {HOST}" in msg
    assert "device-type: lock has 'cpu', this machine has 'cuda'" in msg
    assert "different lock" not in msg


def test_a_rank_that_fails_to_check_does_not_hang_the_others(ranks):
    msg = _all_raise(ranks, "rank 1 fails to check")
    assert "rank 1 on" in msg and "checking failed: RuntimeError: NVML exploded" in msg


def test_every_fault_is_listed(ranks):
    msg = _all_raise(ranks, "both")
    assert ranks[0]["both"]["ranks"] == [1, 2]
    assert msg.startswith("the kernel lock check failed on 2 of 4 rank(s) (1-2):")
    assert "rank 1 on" in msg and "rank 2 on" in msg and "device-type: lock has 'cpu', this machine has 'rocm'" in msg


# ---- the pieces, in one process ------------------------------------------------------------
def _report(rank, digest="sha256:" + "a" * 64, differences=(), host="node1"):
    return {"rank": rank, "host": host, "lock": "k.toml", "digest": digest, "differences": list(differences)}


B = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    "reports,faulty",
    [
        ([], None),
        ([_report(0)], None),
        ([_report(r) for r in range(64)], None),
        ([_report(0), _report(1, B)], [1]),  # a tie: the lowest rank's lock is the reference
        ([_report(0, B), _report(1), _report(2)], [0]),
        ([_report(0), _report(1, differences=["torch: ..."])], [1]),
        ([_report(r, B if r in (5, 6, 7, 40) else "sha256:" + "a" * 64) for r in range(64)], [5, 6, 7, 40]),
    ],
)
def test_judge(reports, faulty):
    error = judge(reports)
    if faulty is None:
        assert error is None
    else:
        assert isinstance(error, RanksDisagree) and error.ranks == faulty and error.exit_code == 3
        assert len(error.reports) == len(reports)


@pytest.mark.parametrize("ranks_,text", [([0], "0"), ([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([3, 1, 2], "1-3"), ([], "")])
def test_ranks_text(ranks_, text):
    assert _ranks_text(ranks_) == text


def test_without_a_process_group_the_process_is_a_world_of_one(tmp_path):
    import torch.distributed as dist

    assert not dist.is_initialized()
    check_ranks(_sealed(MINIMAL_LOCK))
    with pytest.raises(RanksDisagree, match="(?s)failed on 1 of 1 rank.*rank 0 on .*device-type: lock has 'rocm'"):
        check_ranks(_sealed(MINIMAL_LOCK.replace('value = "cpu"', 'value = "rocm"')))


def test_local_report_names_rank_host_lock_and_content_digest(lock_file):
    lock = kernel_lock.load(lock_file, emit_warnings=False)  # no digest: the content digest still identifies it
    r = local_report(lock, rank=7)
    assert r == {"rank": 7, "host": HOST, "lock": str(lock_file), "digest": lock.compute_digest(), "differences": []}
    assert Path(r["lock"]).exists()


def test_many_ranks_with_one_problem_are_one_entry():
    reports = [_report(r, host=f"nid{r // 4:03d}", differences=["torch: lock has '2.11.0', this machine has '2.12.0'"])
               for r in range(64)]  # fmt: skip
    msg = str(judge(reports))
    assert msg.count("torch: lock has") == 1 and "ranks 0-63 on nid000, nid001" in msg and "(16 hosts)" in msg
