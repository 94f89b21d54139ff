"""Many ranks, one lock: kernel_lock.distributed.check_ranks on 4 real processes (gloo, this CPU).

The 4 processes are started once and run every scenario in turn (one process group, one torch import
per process), each rank writing what it saw; the tests then read the scenarios one by one. A second,
smaller group runs where numpy cannot be imported, as in a venv without it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import kernel_lock
from kernel_lock import RanksDisagree
from kernel_lock.distributed import (
    _exchange_device_type,
    _ranks_text,
    check_ranks,
    judge,
    local_report,
)
from tests.conftest import MINIMAL_LOCK, ROOT, sealed_lock

WORLD = 4
HOST = socket.gethostname()

WORKER = r"""
import os, sys
if os.environ.get("KP_TEST_WITHOUT_NUMPY"):
    sys.modules["numpy"] = None  # as in a venv without numpy: every `import numpy` fails
import datetime, json
import torch
import torch.distributed as dist
import kernel_lock
from kernel_lock import fingerprint
from kernel_lock.distributed import check_ranks

rank, world = int(sys.argv[1]), int(sys.argv[2])
init, plan_path, out_path = sys.argv[3], sys.argv[4], sys.argv[5]
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
    fingerprint.current = current  # what lock.verify() reads on this rank (torch is imported here)
    try:
        check_ranks(lock)
        results[scenario["name"]] = {"ok": True}
    except kernel_lock.RanksDisagree as exc:
        results[scenario["name"]] = {"ok": False, "type": "RanksDisagree", "message": str(exc),
                                     "ranks": exc.ranks}
    except Exception as exc:
        results[scenario["name"]] = {"ok": False, "type": type(exc).__name__, "message": str(exc)}
dist.destroy_process_group()
try:
    torch.zeros(1).numpy()
    numpy = "available"
except RuntimeError as exc:  # what torch itself says when numpy is missing
    numpy = str(exc)
open(out_path, "w").write(json.dumps({"numpy": numpy, "scenarios": results}))
"""


def _run_ranks(
    tmp: Path, plan: list[dict], *, world: int, without_numpy: bool = False
) -> dict[int, dict]:
    """Run ``plan`` on ``world`` real gloo ranks; per rank, {"numpy": ..., "scenarios": {name:
    outcome}}."""
    (tmp / "plan.json").write_text(json.dumps(plan))
    script = tmp / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp / 'rendezvous'}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if without_numpy:
        env["KP_TEST_WITHOUT_NUMPY"] = "1"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(r),
                str(world),
                init,
                str(tmp / "plan.json"),
                str(tmp / f"{r}.json"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            # a hung collective fails the test, never hangs it
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{log}"
    results = {r: json.loads((tmp / f"{r}.json").read_text()) for r in range(world)}
    assert all(set(results[r]["scenarios"]) == {s["name"] for s in plan} for r in results)
    return results


def _locks(tmp: Path) -> tuple[Path, Path]:
    same, other = tmp / "kernel-lock.toml", tmp / "other-lock.toml"
    sealed_lock(MINIMAL_LOCK).dump(same)
    sealed_lock(MINIMAL_LOCK.replace("kwargs = { bias = false }", "kwargs = { bias = true }")).dump(
        other
    )
    return same, other


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict[str, dict]]:
    tmp = tmp_path_factory.mktemp("ranks")
    same, other = _locks(tmp)
    plan = [
        {"name": "agree", "lock": str(same), "ranks": {}},
        {
            "name": "rank 2 holds another lock",
            "lock": str(same),
            "ranks": {"2": {"lock": str(other)}},
        },
        {
            "name": "rank 0 holds another lock",
            "lock": str(same),
            "ranks": {"0": {"lock": str(other)}},
        },
        {
            "name": "rank 3 is another machine",
            "lock": str(same),
            "ranks": {"3": {"current": {"device-type": "cuda"}}},
        },
        {"name": "rank 1 fails to check", "lock": str(same), "ranks": {"1": {"crash": True}}},
        {
            "name": "both",
            "lock": str(same),
            "ranks": {"1": {"lock": str(other)}, "2": {"current": {"device-type": "rocm"}}},
        },
    ]
    results = _run_ranks(tmp, plan, world=WORLD)
    return {r: results[r]["scenarios"] for r in results}


def _all_raise(ranks, scenario: str) -> str:
    """Every rank raised RanksDisagree with the same message; return it."""
    seen = [ranks[r][scenario] for r in range(WORLD)]
    assert all(s["ok"] is False and s["type"] == "RanksDisagree" for s in seen), seen
    assert len({s["message"] for s in seen}) == 1 and len({tuple(s["ranks"]) for s in seen}) == 1
    return seen[0]["message"]


@pytest.mark.slow
def test_ranks_that_agree_go_on(ranks):
    assert [ranks[r]["agree"] for r in range(WORLD)] == [{"ok": True}] * WORLD


def test_a_rank_with_another_lock_stops_every_rank(ranks):
    msg = _all_raise(ranks, "rank 2 holds another lock")
    assert ranks[0]["rank 2 holds another lock"]["ranks"] == [2]
    assert (
        "3 rank(s) (0-1, 3) hold lock sha256:" in msg and "1 rank(s) hold a different lock" in msg
    )
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
    assert (
        "rank 1 on" in msg
        and "rank 2 on" in msg
        and "device-type: lock has 'cpu', this machine has 'rocm'" in msg
    )


@pytest.mark.slow
def test_ranks_exchange_their_reports_without_numpy(tmp_path):
    # torch's all_gather_object needs numpy ("RuntimeError: Numpy is not available"); the JSON-bytes
    # exchange must not, so a job in a venv without numpy still gets its verdict
    same, other = _locks(tmp_path)
    plan = [
        {"name": "agree", "lock": str(same), "ranks": {}},
        {
            "name": "rank 1 holds another lock",
            "lock": str(same),
            "ranks": {"1": {"lock": str(other)}},
        },
        {"name": "rank 0 fails to check", "lock": str(same), "ranks": {"0": {"crash": True}}},
    ]
    results = _run_ranks(tmp_path, plan, world=2, without_numpy=True)
    for r in (0, 1):
        # numpy really was absent
        assert "Numpy is not available" in results[r]["numpy"], results[r]["numpy"]
        seen = results[r]["scenarios"]
        assert seen["agree"] == {"ok": True}
        assert seen["rank 1 holds another lock"]["type"] == "RanksDisagree"
        assert seen["rank 1 holds another lock"]["ranks"] == [1]
        assert seen["rank 0 fails to check"]["ranks"] == [0]
        assert (
            "checking failed: RuntimeError: NVML exploded"
            in seen["rank 0 fails to check"]["message"]
        )


# ---- the pieces, in one process ------------------------------------------------------------
def _report(rank, digest="sha256:" + "a" * 64, differences=(), host="node1"):
    return {
        "rank": rank,
        "host": host,
        "lock": "k.toml",
        "digest": digest,
        "differences": list(differences),
    }


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
        (
            [_report(r, B if r in (5, 6, 7, 40) else "sha256:" + "a" * 64) for r in range(64)],
            [5, 6, 7, 40],
        ),
    ],
)
def test_judge(reports, faulty):
    error = judge(reports)
    if faulty is None:
        assert error is None
    else:
        assert isinstance(error, RanksDisagree) and error.ranks == faulty and error.exit_code == 3
        assert len(error.reports) == len(reports)


@pytest.mark.parametrize(
    "ranks_,text", [([0], "0"), ([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([3, 1, 2], "1-3"), ([], "")]
)
def test_ranks_text(ranks_, text):
    assert _ranks_text(ranks_) == text


def test_without_a_process_group_the_process_is_a_world_of_one(tmp_path):
    import torch.distributed as dist

    assert not dist.is_initialized()
    check_ranks(sealed_lock(MINIMAL_LOCK))
    with pytest.raises(
        RanksDisagree, match="(?s)failed on 1 of 1 rank.*rank 0 on .*device-type: lock has 'rocm'"
    ):
        check_ranks(sealed_lock(MINIMAL_LOCK.replace('value = "cpu"', 'value = "rocm"')))


def test_local_report_names_rank_host_lock_and_content_digest(lock_file):
    # no digest: the content digest still identifies it
    lock = kernel_lock.load(lock_file, emit_warnings=False)
    r = local_report(lock, rank=7)
    assert r == {
        "rank": 7,
        "host": HOST,
        "lock": str(lock_file),
        "digest": lock.compute_digest(),
        "differences": [],
    }
    assert Path(r["lock"]).exists()


def test_many_ranks_with_one_problem_are_one_entry():
    reports = [
        _report(
            r,
            host=f"nid{r // 4:03d}",
            differences=["torch: lock has '2.11.0', this machine has '2.12.0'"],
        )
        for r in range(64)
    ]
    msg = str(judge(reports))
    assert (
        msg.count("torch: lock has") == 1
        and "ranks 0-63 on nid000, nid001" in msg
        and "(16 hosts)" in msg
    )


# ---- the exchange, with a fake process group in this process -------------------------------------
@pytest.fixture
def fake_group(monkeypatch):
    """A world of 2 in this process: rank 0 is this process, rank 1 sends ``state["other"]``
    (bytes)."""
    import torch
    import torch.distributed as dist

    state: dict = {"backend": "gloo", "other": None, "calls": 0}

    def all_gather(outputs, tensor, group=None):
        state["calls"] += 1
        if "fail" in state:
            raise state["fail"]
        other = state["other"]
        outputs[0].copy_(tensor)
        if tensor.dtype == torch.int64:  # the lengths
            outputs[1].fill_(len(other))
        else:
            outputs[1].zero_()
            outputs[1][: len(other)] = torch.tensor(list(other), dtype=torch.uint8)

    for name, value in {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "get_rank": lambda group=None: 0,
        "get_world_size": lambda group=None: 2,
        "get_backend": lambda group=None: state["backend"],
        "all_gather": all_gather,
    }.items():
        monkeypatch.setattr(dist, name, value)
    return state


def _sent(report: dict) -> bytes:
    return json.dumps(report).encode("utf-8")


def test_the_exchange_round_trips_reports(fake_group):
    lock = sealed_lock(MINIMAL_LOCK)
    fake_group["other"] = _sent(_report(1, digest=B, host="nid001"))
    with pytest.raises(RanksDisagree) as info:
        check_ranks(lock)
    # a tie: rank 0's lock is the reference, rank 1 is the stray
    assert info.value.ranks == [1] and "rank 1 on nid001: sha256:bbbb" in str(info.value)
    assert [r["rank"] for r in info.value.reports] == [0, 1] and fake_group["calls"] == 2

    fake_group["other"] = _sent({**local_report(lock, rank=1), "host": "nid001"})
    check_ranks(lock)  # the same lock on a matching machine: no error


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("Connection closed by peer [10.0.0.2]:29500"),
        ValueError("Tensor list input to all_gather must be on the same device"),
    ],
)
def test_a_failed_exchange_is_ranks_disagree(fake_group, exc):
    fake_group["fail"] = exc
    with pytest.raises(RanksDisagree) as info:
        check_ranks(sealed_lock(MINIMAL_LOCK))
    error = info.value
    assert error.exit_code == 3 and error.__cause__ is exc
    assert f"rank 0 on {HOST} could not exchange its kernel lock report" in error.problem
    assert f"(backend gloo): {type(exc).__name__}: {exc}" in error.problem
    assert "torch.cuda.set_device(local_rank)" in error.fix and "fix:" in str(error)


def test_a_rank_whose_check_crashed_still_exchanges(fake_group, monkeypatch):
    from kernel_lock import fingerprint

    def crash(*a, **k):
        raise RuntimeError("NVML exploded")

    monkeypatch.setattr(fingerprint, "current", crash)
    lock = sealed_lock(MINIMAL_LOCK)
    fake_group["other"] = _sent(_report(1, digest=lock.compute_digest()))
    with pytest.raises(RanksDisagree, match="checking failed: RuntimeError: NVML exploded") as info:
        check_ranks(lock)
    assert info.value.ranks == [0] and fake_group["calls"] == 2


@pytest.mark.parametrize(
    "blob,key,why",
    [
        (b"\xff\xfe\x00garbage", "", "codec can't decode"),
        (b"{not json", "", "Expecting property name"),
        (b"[1, 2]", "", "expected a JSON object, got a JSON list"),
        (b"[" * 100_000 + b"]" * 100_000, "", "recursion"),
        (
            _sent({"rank": 1, "host": "n", "lock": "k.toml", "digest": B}),
            "differences",
            "required key is missing",
        ),
        (_sent({**_report(1), "differences": None}), "differences", "required key is missing"),
        (_sent(_report(1, differences=[3])), "differences[0]", "expected string, got int"),
        (_sent(_report(1, differences=[None])), "differences[0]", "expected string, got NoneType"),
        (
            _sent(_report(1, differences=["x"] * 257)),
            "differences",
            "257 entries, more than the 256",
        ),
        (_sent(_report(1, differences=["x" * 5000])), "differences[0]", "more than the 4096"),
        (_sent({**_report(1), "rank": True}), "rank", "expected integer, got boolean True"),
        (_sent({**_report(1), "rank": -1}), "rank", "out of range"),
        (_sent({**_report(1), "rank": 1.0}), "rank", "expected integer, got float"),
        (_sent({**_report(1), "host": "h" * 300}), "host", "more than the 255"),
        (
            _sent({**_report(1), "digest": "sha256:abc"}),
            "digest",
            "is not 'sha256:<64 hex digits>'",
        ),
        (_sent({**_report(1), "digets": B}), "digets", "unknown key 'digets'"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_report_that_does_not_decode_is_ranks_disagree(fake_group, blob, key, why):
    """Issue 34: another rank's report goes through the typed reader (kernel_lock.tables):
    bounded, unknown keys refused, an error naming the rank it came from and the key."""
    fake_group["other"] = blob
    with pytest.raises(RanksDisagree) as info:
        check_ranks(sealed_lock(MINIMAL_LOCK))
    assert info.value.exit_code == 3 and info.value.ranks == [1]
    assert (
        "the kernel lock report of group rank 1 did not decode (backend gloo)" in info.value.problem
    )
    assert (f", key {key!r}:" in info.value.problem) == bool(key)
    assert why in info.value.problem and "same kernel_lock version on every rank" in info.value.fix
    assert len(info.value.problem) < 800  # the received bytes are shown cut short


def test_the_report_reader_round_trips_what_local_report_writes():
    from kernel_lock.distributed import report_from_dict

    report = local_report(sealed_lock(MINIMAL_LOCK), rank=3)
    assert report_from_dict(json.loads(json.dumps(report))) == report


def test_an_unknown_key_in_a_report_names_the_closest(fake_group):
    fake_group["other"] = _sent({**_report(1), "digets": B})
    with pytest.raises(RanksDisagree) as info:
        check_ranks(sealed_lock(MINIMAL_LOCK))
    assert "did you mean 'digest'?" in info.value.fix


def test_an_nccl_group_needs_a_current_cuda_device(fake_group, monkeypatch):
    import torch

    def no_device():
        raise RuntimeError("No CUDA GPUs are available")

    monkeypatch.setattr(torch.cuda, "current_device", no_device)
    fake_group["backend"] = "nccl"
    with pytest.raises(
        RanksDisagree, match=r"\(backend nccl\): RuntimeError: No CUDA GPUs are available"
    ):
        check_ranks(sealed_lock(MINIMAL_LOCK))
    assert fake_group["calls"] == 0


@pytest.mark.parametrize(
    "backend,device",
    [
        ("gloo", "cpu"),
        ("mpi", "cpu"),
        ("nccl", "cuda"),
        ("cpu:gloo,cuda:nccl", "cpu"),
        ("cuda:nccl", "cuda"),
        ("ucc", "cpu"),
    ],
)
def test_the_exchange_device_follows_the_backend(backend, device):
    assert _exchange_device_type(backend) == device


# ---- numpy is a declared dependency (torch warns at import without it) ---------------------------
def test_numpy_is_declared():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "numpy" in {Requirement(d).name for d in project["dependencies"]}


@pytest.mark.slow
def test_a_command_that_imports_torch_prints_no_numpy_warning():
    # `import torch` without numpy prints "UserWarning: Failed to initialize NumPy" on every command
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_probe.cli", "env", "--no-import-checks", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "NumPy" not in proc.stderr and "UserWarning" not in proc.stderr, proc.stderr
