"""Many ranks, one probe (kernel_probe.jobstart): the job marker, the node-local wait,
bounded backoff on the shared directory, the prober's failure reaching every rank, and the no-flock
path."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernel_lock
from kernel_probe import jobstart
from kernel_probe.candidates import default_for
from kernel_probe.errors import NodeDiffers, ProbeError, UsageError
from kernel_probe.jobstart import Marker, RankFailed, WaitTimeout
from kernel_probe.probe import planning
from kernel_probe.ranks import LAUNCHERS, JobRank
from tests.conftest import sealed_lock, small_probe
from tests.kernel_probe.probe.test_candidates_data import _lock_pinning

ROOT = Path(__file__).resolve().parents[3]
REQUEST = dict(slots=("LayerNorm",), shapes=("64x32",), reps=1, precision="32-true")
LAUNCHER_VARS = {
    n
    for spec in LAUNCHERS
    for n in (spec.rank, *spec.size, *spec.local_rank, *spec.node, *spec.job)
} | {
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT",
    "PBS_JOBID",
    "FLUX_JOB_ID",
}


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    """The tests set the launcher variables they mean; pytest may run under a real launcher."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(jobstart.NODE_DIR_ENV, raising=False)


def slurm(
    monkeypatch,
    tmp_path: Path,
    rank: int,
    *,
    local: int,
    node: int = 0,
    job: str = "77",
    restart=None,
):
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": "16",
        "TMPDIR": str(tmp_path / f"node{node}"),
    }
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = str(restart)
    (tmp_path / f"node{node}").mkdir(exist_ok=True)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def job_rank(rank: int = 0, local: int | None = 0, job: str = "77", attempt: str = "0") -> JobRank:
    return JobRank("slurm", rank, job, attempt, 16, local, 0)


def current_lock(out: Path, request: planning.ProbeRequest) -> kernel_lock.KernelLock:
    """A lock current for ``request`` on this machine, as an earlier job's rank 0 would have left
    it."""
    digest = planning.plan(request).digest
    lock = dataclasses.replace(
        _lock_pinning(default_for("LayerNorm")), provenance={"inputs": digest}
    ).sealed()
    out.parent.mkdir(parents=True, exist_ok=True)
    lock.dump(out)
    return lock


def marked(
    out: Path, lock: kernel_lock.KernelLock, rank: JobRank, request: planning.ProbeRequest
) -> Marker:
    marker = Marker(
        "written",
        rank.key,
        rank.describe(),
        "node0",
        lock.compute_digest(),
        planning.plan(request).digest,
    )
    jobstart.publish(out, rank, marker, lock.dumps())
    return marker


# ---- the job marker: a lock from another job or attempt is never taken for this one's ------------
@pytest.mark.parametrize(
    "earlier",
    [None, job_rank(job="76"), job_rank(attempt="1")],
    ids=["no-marker", "another-job", "another-attempt"],
)
def test_a_current_lock_without_this_jobs_marker_is_never_reused(tmp_path, monkeypatch, earlier):
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=0.2, **REQUEST)
    lock = current_lock(out, request)
    if earlier is not None:
        marked(out, lock, earlier, request)
    slurm(
        monkeypatch, tmp_path, 1, local=1, restart=2 if earlier and earlier.attempt == "1" else None
    )
    with pytest.raises(WaitTimeout) as exc:
        jobstart.run(request)
    text = str(exc.value)
    attempt = "2" if earlier and earlier.attempt == "1" else "0"
    assert f"rank 0 of slurm job 77 (attempt {attempt}) wrote no job marker" in text
    assert "this is rank 1 of 16, node 0, local rank 1" in text and "--lock-timeout" in text


def test_a_waiting_rank_takes_the_lock_rank_0_marked_for_this_job(tmp_path, monkeypatch, capsys):
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=5, **REQUEST)
    lock = current_lock(out, request)
    slurm(monkeypatch, tmp_path, 3, local=3)
    marked(out, lock, job_rank(), request)
    result = jobstart.run(request)
    assert result.reused and result.lock.compute_digest() == lock.compute_digest()
    assert result.source.startswith("rank 0 of 16") and "slurm job 77" in result.source


def test_a_rank_on_the_node_waits_on_the_node_local_copy_not_the_shared_directory(
    tmp_path, monkeypatch
):
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=5, **REQUEST)
    lock = current_lock(out, request)
    slurm(monkeypatch, tmp_path, 5, local=5)
    rank = job_rank()
    marked(out, lock, rank, request)
    local = jobstart.node_dir(out, rank)
    assert local.is_relative_to(tmp_path / "node0")  # $TMPDIR: this node's
    jobstart.marker_path(
        out, rank
    ).unlink()  # the shared marker gone: the node-local copy is enough
    assert jobstart.run(request).reused
    # on another node (its own $TMPDIR) nothing was copied yet: a non-watching rank there waits for
    # its watcher
    slurm(monkeypatch, tmp_path, 13, local=5, node=1)
    with pytest.raises(WaitTimeout):
        jobstart.run(dataclasses.replace(request, lock_timeout=0.15))


def test_a_node_differing_from_rank_0s_lock_is_told_to_probe_per_node_type(tmp_path, monkeypatch):
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=5, **REQUEST)
    here = current_lock(out, request)
    text = here.dumps().replace('device-type = { value = "cpu"', 'device-type = { value = "cuda"')
    other = sealed_lock(text)
    other.dump(out)
    slurm(monkeypatch, tmp_path, 1, local=1)
    marked(out, other, job_rank(), request)
    with pytest.raises(NodeDiffers) as exc:
        jobstart.run(request)
    assert (
        exc.value.exit_code == 3
        and "device-type" in str(exc.value)
        and "--probe-per node-type" in str(exc.value)
    )


def test_other_options_or_a_replaced_lock_are_errors_not_a_silent_reuse(tmp_path, monkeypatch):
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=5, **REQUEST)
    lock = current_lock(out, request)
    # a watching rank: it reads the shared lock itself
    slurm(monkeypatch, tmp_path, 1, local=0, node=1)
    other_options = dataclasses.replace(request, shapes=("128x32",))
    marked(out, lock, job_rank(), other_options)
    with pytest.raises(UsageError, match="with other options than this rank"):
        jobstart.run(request)
    marked(out, lock, job_rank(), request)
    replaced = dataclasses.replace(lock, created_by="someone else").sealed()
    replaced.dump(out)  # after the marker: another job wrote the same --out
    for f in (tmp_path / "node1").rglob("ready"):
        f.unlink()
    with pytest.raises(
        ProbeError,
        match=r"is not the lock rank 0 of 16.* wrote for this job \(its digest differs\)",
    ):
        jobstart.run(request)


def test_a_failed_prober_fails_every_waiting_rank_at_once_with_its_exit_code(tmp_path):
    out = tmp_path / "k.toml"
    prober = job_rank()
    exc = ProbeError("no candidate of LayerNorm was accepted", fix="run `kernel-probe check`")
    jobstart.publish(out, prober, jobstart.failure_marker(prober, exc), None)
    for rank in (
        job_rank(1, local=1),
        job_rank(9, local=0),
    ):  # on its node (local copy), and a watcher
        with pytest.raises(RankFailed) as err:
            jobstart.wait(out, rank, mode="job", timeout=5)
        assert err.value.exit_code == 1 and "rank 0 of 16" in err.value.problem
        assert (
            "no candidate of LayerNorm" in err.value.problem
            and err.value.fix == "run `kernel-probe check`"
        )


# ---- waiting is cheap: bounded, jittered backoff; O(log time) looks at the shared directory ------
class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _count_reads(monkeypatch, shared: Path) -> list[Path]:
    reads: list[Path] = []
    real = jobstart._read

    def counting(path):
        if Path(path).parent == shared:
            reads.append(Path(path))
        return real(path)

    monkeypatch.setattr(jobstart, "_read", counting)
    return reads


def _wait_in_vain(
    tmp_path, monkeypatch, rank: JobRank, timeout: float
) -> tuple[list[Path], FakeTime]:
    """Wait, in simulated time, for a marker that never comes: (the shared-directory reads, the
    sleeps)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    reads = _count_reads(monkeypatch, shared)
    t = FakeTime()
    with pytest.raises(WaitTimeout):
        jobstart.wait(
            shared / "k.toml", rank, mode="job", timeout=timeout, clock=t.clock, sleep=t.sleep
        )
    return reads, t


def test_the_watching_rank_backs_off_from_0_1_to_5_seconds(tmp_path, monkeypatch):
    reads, t = _wait_in_vain(tmp_path, monkeypatch, job_rank(8, local=0), 60)
    base = [min(0.1 * 2**i, 5.0) for i in range(len(t.sleeps))]
    assert all(0.8 * b <= s <= 1.2 * b + 1e-9 for s, b in zip(t.sleeps[:-1], base, strict=False))
    assert len(set(round(s, 6) for s in t.sleeps)) > 5  # jittered, not in step with the other nodes
    # 60 s: 6 checks to reach the cap, then one per ~5 s (not 1200, as filelock's 0.05 s poll would)
    assert 14 <= len(reads) <= 20, len(reads)


def test_a_rank_that_does_not_watch_looks_at_the_shared_directory_rarely(tmp_path, monkeypatch):
    reads, t = _wait_in_vain(tmp_path, monkeypatch, job_rank(3, local=3), 600)
    assert 1 <= len(reads) <= 5, len(reads)  # at ~30, 60, 120, 240 ... s: a fallback, not a poll
    assert max(t.sleeps) <= 1.2  # the node-local file is checked often: it costs nothing shared


def test_node_type_claims_are_exclusive_and_need_no_file_lock(tmp_path, monkeypatch):
    out = tmp_path / "k.toml"
    assert jobstart.claim(out, job_rank(0)) is True
    assert jobstart.claim(out, job_rank(8)) is False
    assert "rank 0 of 16" in jobstart.claim_path(out, job_rank()).read_text()
    t = FakeTime()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    with pytest.raises(
        WaitTimeout, match=r"the rank that claimed k.toml for this node type .*\(rank 0 of 16"
    ):
        jobstart.wait(out, job_rank(8), mode="node-type", timeout=1, clock=t.clock, sleep=t.sleep)


def test_node_type_needs_the_placeholder_and_names_the_device(tmp_path):
    with pytest.raises(UsageError, match=r"names no \{node-type\}"):
        jobstart.run(
            planning.ProbeRequest(out=tmp_path / "k.toml", probe_per="node-type", **REQUEST)
        )
    name = jobstart.node_type(
        {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "count": 4}
    )
    assert name.startswith("cuda-sm_90-4-") and "/" not in name
    assert name != jobstart.node_type(
        {"type": "cuda", "name": "NVIDIA A100", "arch": "sm_80", "count": 4}
    )


def test_bad_launcher_variables_are_a_usage_error_and_rank_ignores_them(tmp_path, monkeypatch):
    slurm(monkeypatch, tmp_path, 1, local=1)
    monkeypatch.setenv("SLURM_PROCID", "one")
    request = planning.ProbeRequest(out=tmp_path / "k.toml", **REQUEST)
    with pytest.raises(UsageError, match="SLURM_PROCID='one'") as exc:
        jobstart.run(request)
    assert exc.value.exit_code == 2 and "--probe-per rank" in str(exc.value)
    assert jobstart._job_rank("rank", planning.Events()) is None


# ---- the processes themselves: one probe, with and without file locks ----------------------------
NO_FLOCK = """\
import errno, fcntl
def _refuse(*a, **k):
    raise OSError(errno.ENOLCK, "No locks available (simulated)")
fcntl.flock = fcntl.lockf = _refuse
"""


@pytest.mark.slow
def test_six_ranks_on_two_nodes_without_file_locks_probe_once(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_FLOCK)
    shared = tmp_path / "shared"
    shared.mkdir()
    out = shared / "k.toml"
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    base["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), base.get("PYTHONPATH", "")])

    def start(job: str) -> list[tuple[int, str, str]]:
        procs = []
        for rank in range(6):
            node = rank // 3
            (tmp_path / f"node{node}").mkdir(exist_ok=True)
            env = dict(
                base,
                SLURM_JOB_ID=job,
                SLURM_PROCID=str(rank),
                SLURM_LOCALID=str(rank % 3),
                SLURM_NODEID=str(node),
                SLURM_NTASKS="6",
                TMPDIR=str(tmp_path / f"node{node}"),
            )
            argv = [
                sys.executable,
                "-m",
                "kernel_probe",
                "--out",
                str(out),
                "--json",
                *small_probe("LayerNorm", reps=1),
            ]
            procs.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        return [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in procs]  # type: ignore[union-attr]

    cold = start("501")
    assert [code for code, _, _ in cold] == [0] * 6, [err[-500:] for _, _, err in cold]
    replies = [json.loads(o) for _, o, _ in cold]
    # rank 0 probed; the others took its lock
    assert [r["reused"] for r in replies] == [False] + [True] * 5
    assert all(r.get("written-by", "").startswith("rank 0 of 6") for r in replies[1:])
    # the no-flock warning, rank 0 only
    assert "the ranks of this job still probe once" in cold[0][2]
    assert not any("file locks" in err for _, _, err in cold[1:])
    warm = start("502")  # the next job: rank 0 reuses the lock and marks it for that job
    assert [json.loads(o)["reused"] for _, o, _ in warm] == [True] * 6
    markers = sorted(p.name for p in shared.iterdir() if ".job-" in p.name)
    assert markers == [".k.toml.job-slurm-501-a0", ".k.toml.job-slurm-502-a0"]


@pytest.mark.slow
def test_without_rank_variables_a_file_system_without_locks_still_warns(
    tmp_path, capsys, monkeypatch
):
    import filelock

    from tests.conftest import run_cli

    def unsupported(self, *a, **k):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(filelock.FileLock, "acquire", unsupported)
    code, _, err = run_cli(["--out", tmp_path / "k.toml", *small_probe("LayerNorm")], capsys)
    assert code == 0 and "does not do file locks" in err and "one rank probes without them" in err


def test_a_profile_can_choose_one_probe_per_node_type(tmp_path):
    from kernel_lock.errors import LockError
    from kernel_probe.profiles import parse

    head = 'profile-version = "1"\nname = "mixed"\n[detect]\nenv = { MIXED = "" }\n[policy]\n'
    assert parse(head + 'probe-per = "node-type"\n', "mixed.toml").probe_per == "node-type"
    assert parse(head, "mixed.toml").probe_per is None
    with pytest.raises(LockError, match="policy.probe-per") as exc:
        parse(head + 'probe-per = "node"\n', "mixed.toml")
    assert exc.value.exit_code == 5


def test_node_type_mode_waits_for_the_rank_that_claimed_its_kind_of_node(tmp_path, monkeypatch):
    request = planning.ProbeRequest(
        out=tmp_path / "shared" / "k.{node-type}.toml",
        probe_per="node-type",
        lock_timeout=5,
        **REQUEST,
    )
    kind = jobstart.node_type(planning.plan(request).device)
    out = tmp_path / "shared" / f"k.{kind}.toml"
    lock = current_lock(out, request)
    assert jobstart.claim(out, job_rank(0))  # a node of this kind claimed it first
    marked(out, lock, job_rank(), request)
    # this node's watching rank: its claim loses, it waits
    slurm(monkeypatch, tmp_path, 8, local=0, node=1)
    result = jobstart.run(request)
    assert result.lock_path == out, (result.lock_path, out)
    assert result.reused and result.source.startswith("rank 0 of 16")


def test_rank_0_failing_before_any_work_still_releases_the_others(tmp_path, monkeypatch):
    """E.g. rank 0's node fails the profile (exit 4) while the others' nodes pass: they fail with
    it."""
    out = tmp_path / "shared" / "k.toml"
    out.parent.mkdir()
    slurm(monkeypatch, tmp_path, 0, local=0)
    with pytest.raises(UsageError):
        jobstart.run(planning.ProbeRequest(out=out, **{**REQUEST, "reps": 0}))
    with pytest.raises(RankFailed) as err:
        jobstart.wait(out, job_rank(1, local=1), mode="job", timeout=5)
    assert err.value.exit_code == 2 and "--reps must be a whole number from 1" in err.value.problem


@pytest.mark.parametrize("special", ["fifo", "huge"])
def test_a_special_file_where_the_job_marker_should_be_fails_fast_naming_it(tmp_path, special):
    """A FIFO (an open that would block for ever) or a huge file at the marker's path is an error
    naming it, exit 5, for a watching rank: never a hang, never a read into memory."""
    from kernel_probe.errors import InputFileError

    out = tmp_path / "k.toml"
    rank = job_rank(9, local=0)  # a node's watcher reads the shared marker
    path = jobstart.marker_path(out, rank)
    if special == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as fh:
            fh.truncate(64 << 20)  # sparse: larger than any lock or marker may be
    with pytest.raises(InputFileError) as err:
        jobstart.wait(out, rank, mode="job", timeout=5)
    assert (
        err.value.exit_code == 5
        and err.value.path == str(path)
        and f"remove {path}" in err.value.fix
    )


# ---- issue 34: the marker through the one writer and the one typed reader; identity;
# rank 0's bad argument
def test_a_link_planted_at_the_marker_path_is_never_written_through(tmp_path):
    out, victim = tmp_path / "L.toml", tmp_path / "victim.txt"
    victim.write_text("precious")
    rank = job_rank()
    jobstart.marker_path(out, rank).symlink_to(victim)
    with pytest.raises(kernel_lock.LockFormatError, match="symbolic link"):
        jobstart.publish(out, rank, Marker("reused", rank.key, "r0", "h"), "")
    assert victim.read_text() == "precious"


def test_a_node_local_folder_made_beforehand_by_someone_else_is_neither_used_nor_read(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    out, rank, victim = tmp_path / "k.toml", job_rank(1, local=1), tmp_path / "victim.txt"
    victim.write_text("precious")
    local = jobstart.node_dir(out, rank)
    local.mkdir(parents=True)
    os.chmod(local.parent, 0o777)  # what another user on the node would have left, open to all
    forged = Marker("written", rank.key, "an attacker", "h", digest="sha256:" + "0" * 64)
    (local / "ready").write_text(
        json.dumps({"marker": dataclasses.asdict(forged), "lock": "forged"})
    )
    assert jobstart._from_local(local / "ready", rank) is None  # never read from there
    (local / "ready").unlink()
    (local / "ready").symlink_to(victim)
    jobstart._publish_local(out, rank, Marker("reused", rank.key, "r0", "h"), "lock text")
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"exit_code": 256}, "exit_code"),  # 256 & 0xFF once made a failure exit 0
        ({"exit_code": "abc"}, "exit_code"),
        ({"exit_code": 7}, "exit_code"),  # not in the documented table
        ({"exit_code": True}, "exit_code"),
        ({"exit_code": 0}, "exit_code"),  # a failure with code 0
        ({"outcome": "won"}, "outcome"),
        ({"problem": ["x"]}, "problem"),
        ({"job": "x" * 500}, "job"),
        ({"extra": 1}, "extra"),
    ],
)
def test_a_marker_is_read_by_the_typed_reader(tmp_path, change, key):
    rank = job_rank(1, local=0)
    good = dataclasses.asdict(Marker("failed", rank.key, "r0", "h", problem="boom", exit_code=5))
    jobstart.marker_path(tmp_path / "k.toml", rank).write_text(json.dumps({**good, **change}))
    with pytest.raises(jobstart.MarkerError) as err:
        jobstart.wait(tmp_path / "k.toml", rank, mode="job", timeout=5)
    assert (
        err.value.exit_code == 5 and err.value.key == key and str(err.value.path).endswith(rank.key)
    )


def test_a_marker_of_another_identity_is_never_taken(tmp_path):
    rank = job_rank(1, local=0)
    other = dataclasses.asdict(Marker("reused", "slurm-77.0-a0", "r0", "h"))
    jobstart.marker_path(tmp_path / "k.toml", rank).write_text(json.dumps(other))
    with pytest.raises(jobstart.MarkerError, match="not this one"):
        jobstart.wait(tmp_path / "k.toml", rank, mode="job", timeout=5)


def test_torchrun_steps_of_one_slurm_job_have_their_own_markers(tmp_path):
    from kernel_probe.ranks import detect

    base = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "77", "SLURM_JOB_ID": "77"}
    step0, step1 = (detect({**base, "SLURM_STEP_ID": s}).rank for s in ("0", "1"))
    assert step0 is not None and step1 is not None
    out = tmp_path / "k.toml"
    jobstart.publish(
        out, dataclasses.replace(step0, rank=0), Marker("reused", step0.key, "r0", "h"), ""
    )
    # step 1's rank 1 waits for its own rank 0, not step 0's marker
    with pytest.raises(WaitTimeout):
        jobstart.wait(out, step1, mode="job", timeout=0.3)


@pytest.mark.parametrize("argv", [["--timeout", "-1"], ["--lock-timeout", "nan"], ["--reps", "0"]])
def test_rank_0_given_a_bad_argument_fails_every_rank_with_its_exit_code(
    tmp_path, monkeypatch, argv
):
    from kernel_probe.cli import main

    out = tmp_path / "shared" / "k.toml"
    out.parent.mkdir()
    slurm(monkeypatch, tmp_path, 0, local=0)
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), *argv])
    assert exc.value.code == 2
    with pytest.raises(RankFailed) as err:
        jobstart.wait(out, job_rank(1, local=1), mode="job", timeout=5)
    assert err.value.exit_code == 2 and argv[0] in err.value.problem


@pytest.mark.parametrize("foreign", ["user-folder", "job-folder"])
def test_a_node_local_folder_of_another_user_open_to_all_is_neither_used_nor_read_end_to_end(
    tmp_path, monkeypatch, foreign
):
    """Issue 34, through ``jobstart.run``: on a node, another user (uid 12345) made
    ``$TMPDIR/kernel-probe-<uid>`` (or this job's folder in it) beforehand, mode 777, with a
    ``ready`` link in the job's folder. Rank 0 publishes and a waiting rank of the node takes the
    lock: neither writes through the link nor reads anything under that folder; the victim is
    intact."""
    out = tmp_path / "shared" / "k.toml"
    request = planning.ProbeRequest(out=out, lock_timeout=20, **REQUEST)
    lock = current_lock(out, request)
    slurm(monkeypatch, tmp_path, 0, local=0)
    rank = job_rank()
    local = jobstart.node_dir(out, rank)
    local.mkdir(parents=True)
    for folder in (local.parent, local) if foreign == "user-folder" else (local,):
        os.chown(folder, 12345, 12345)
        os.chmod(folder, 0o777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (local / "ready").symlink_to(victim)

    read: list[Path] = []
    real_read = jobstart._read
    monkeypatch.setattr(jobstart, "_read", lambda path: read.append(Path(path)) or real_read(path))
    assert jobstart.run(request).reused  # rank 0: reuses the lock, publishes the marker
    assert victim.read_text() == "precious" and (local / "ready").is_symlink()

    # the link now points at a forged answer, as the attacker would want it read by the node's ranks
    forged = Marker(
        "written", rank.key, "an attacker", "h", digest="sha256:" + "0" * 64, inputs="x"
    )
    payload = json.dumps({"marker": dataclasses.asdict(forged), "lock": "forged"})
    victim.write_text(payload)
    # the rare look at the shared marker, made quick
    monkeypatch.setattr(jobstart, "FALLBACK", (0.05, 0.1))
    slurm(monkeypatch, tmp_path, 5, local=5)
    result = jobstart.run(request)
    # rank 0's, from the shared marker
    assert result.reused and result.lock.compute_digest() == lock.compute_digest()
    assert victim.read_text() == payload  # not replaced by the node leader's copy either
    # nothing under that folder read
    assert not [p for p in read if p.is_relative_to(local.parent)], read
    # left as it was: never used
    assert os.stat(local).st_uid == 12345 and stat_mode(local) == 0o777
    assert sorted(p.name for p in local.iterdir()) == ["ready"]


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
