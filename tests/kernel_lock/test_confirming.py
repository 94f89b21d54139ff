"""kernel_lock.launch: what only an import can tell, asked of a child process (its
verdicts, and a child that cannot give one), and every target of a lock decided before
``kernel-probe rehash`` seals it.

The lock cases are test_locate's: the ones the import path refuses, and good ones.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import kernel_lock
from kernel_lock import fingerprint, launch
from kernel_lock.errors import (
    ExitCode,
    KernelUnavailable,
    LockError,
    LockFormatError,
    TargetNotAllowed,
)
from kernel_lock.launch import before_sealing, child_verdicts, confirm_in_child
from tests.kernel_lock.test_locate import (  # noqa: F401  (ghost_site: a fixture these tests use)
    CASES,
    GOOD,
    _base,
    _child_in_this_process,
    _import_verdict,
    _ln,
    _lock,
    _set,
    ghost_site,
)


# ---- the child's verdicts ------------------------------------------------------------------------
def test_child_verdicts_are_per_slot(tmp_path, monkeypatch):
    started = _child_in_this_process(monkeypatch)
    path = _lock(tmp_path, _set("Linear", target="torch.ao.nn.qat.Linear", kwargs={}))
    lock = kernel_lock.load(path, emit_warnings=False)
    verdicts = child_verdicts(lock, "training", {"LayerNorm": "asked", "Linear": "asked"})
    assert len(started) == 1 and verdicts["LayerNorm"] is None
    bad = verdicts["Linear"]
    assert (
        bad is not None
        and bad["exit_code"] == ExitCode.BAD_INPUT
        and bad["key"] == "slots.Linear.target"
    )
    with pytest.raises(
        LockFormatError, match="found by importing it in a child process: asked without import"
    ):
        confirm_in_child(lock, "training", {"LayerNorm": "asked", "Linear": "asked"})
    confirm_in_child(lock, "training", {"LayerNorm": "asked"})  # a slot that builds: nothing raised


@pytest.mark.parametrize(
    "outcome, words",
    [
        (
            OSError("no interpreter"),
            "importing it in a child process to confirm it failed: no interpreter",
        ),
        (subprocess.TimeoutExpired("python", 300), "timed out after 300 seconds"),
        (subprocess.CompletedProcess([], -9, "", "Killed\n"), "ended without a verdict (Killed)"),
        (
            subprocess.CompletedProcess([], 0, "noise only\n", ""),
            "ended without a verdict (exit status 0)",
        ),
    ],
    ids=["cannot-start", "hangs", "killed", "no-verdict"],
)
def test_a_child_without_a_verdict_is_unavailable_never_current(
    tmp_path, monkeypatch, outcome, words
):
    def run(*_a, **_kw):
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(launch, "run", run)
    lock = kernel_lock.load(_lock(tmp_path, lambda d: None), emit_warnings=False)
    with pytest.raises(KernelUnavailable) as exc:
        child_verdicts(lock, "training", {"Linear": "asked"})
    assert words in str(exc.value) and exc.value.key == "slots.Linear"
    assert exc.value.exit_code == ExitCode.MISMATCH


def test_a_slot_the_child_did_not_answer_is_unavailable(tmp_path, monkeypatch):
    reply = subprocess.CompletedProcess([], 0, launch.MARK + "{}\n", "")
    monkeypatch.setattr(launch, "run", lambda *_a, **_kw: reply)
    lock = kernel_lock.load(_lock(tmp_path, lambda d: None), emit_warnings=False)
    with pytest.raises(KernelUnavailable, match="slot Linear: no verdict"):
        confirm_in_child(lock, "training", {"Linear": "asked"})


# ---- the child's process: no pipe a forked process can hold, nothing left running ----------------
def _gone(pid: int, wait: float = 5.0) -> bool:
    """The process has ended within ``wait`` seconds (a kill is delivered asynchronously); a zombie
    waiting for a reaper that is not ours counts as ended."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


FORKS_AND_EXITS = """
import os, sys, time
request = sys.stdin.read()
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
print(request, pid)
sys.stdout.flush()
os._exit(0)
"""


def test_a_process_the_child_forks_neither_keeps_the_caller_waiting_nor_outlives_it():
    t0 = time.monotonic()
    done = launch.run([sys.executable, "-c", FORKS_AND_EXITS], input="the request", timeout=60.0)
    assert time.monotonic() - t0 < 30  # the forked process would hold a pipe for 600 s
    echoed, pid = done.stdout.split()[-2:]
    assert done.returncode == 0 and done.stdout.startswith("the request") and _gone(int(pid))


@pytest.mark.slow  # waits for a time limit
def test_a_child_that_hangs_is_killed_at_its_time_limit():
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        launch.run([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1.0)
    assert time.monotonic() - t0 < 30


@pytest.mark.slow  # a real child that imports torch
def test_a_library_that_forks_on_import_is_judged_and_its_process_ends(tmp_path, monkeypatch):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("KP_FORKS_PIDFILE", str(pidfile))
    monkeypatch.setenv("KERNEL_LOCK_TRUST", "kp_forks")
    lock = kernel_lock.load(
        _lock(tmp_path, _set("LayerNorm", target="kp_forks.on_import.Norm")), emit_warnings=False
    )
    t0 = time.monotonic()
    # a real child
    assert child_verdicts(lock, "training", {"LayerNorm": "asked"}) == {"LayerNorm": None}
    assert time.monotonic() - t0 < 120
    [pid] = pidfile.read_text().split()
    assert _gone(int(pid))


# ---- before sealing ------------------------------------------------------------------------------
@pytest.mark.usefixtures("ghost_site")
@pytest.mark.parametrize("case", CASES)
def test_sealing_refuses_what_the_import_refuses_or_says_it_could_not_judge(
    tmp_path, monkeypatch, case
):
    """`kernel-probe rehash` decides every target before sealing: never a silent seal of a lock that
    verify and the runtime refuse. Each case is refused as the import refuses it, or sealed with a
    line naming each edited target that cannot be imported here."""
    _child_in_this_process(monkeypatch)
    path = _lock(tmp_path, CASES[case])
    refused = _import_verdict(path)
    lock = kernel_lock.load(path, emit_warnings=False)
    try:
        unjudged = before_sealing(lock, fingerprint.current()["torch"])
    except LockError as exc:
        # what the import refuses too (it may stop first at the machine, exit 3, before reaching a
        # twin)
        assert refused != 0 and isinstance(exc, (TargetNotAllowed, LockFormatError)), (refused, exc)
        assert exc.key.startswith("slots.") and exc.exit_code in (refused, ExitCode.BAD_INPUT)
        return
    base = _base()["slots"]
    edited = [
        f"{at}: {target}"
        for name, e in lock.slots.items()
        for at, target, before in (
            (f"slots.{name}", e.target, base[name]["target"]),
            (f"slots.{name}.twin", e.twin.target if e.twin else "", base[name]["twin"]["target"]),
        )
        if target != before
    ]
    assert edited and all(any(line.startswith(t) for line in unjudged) for t in edited), (
        edited,
        unjudged,
    )


@pytest.mark.parametrize("case", GOOD)
def test_sealing_a_good_lock_judges_every_target(tmp_path, case):
    path = _lock(tmp_path, GOOD[case])
    assert (
        before_sealing(kernel_lock.load(path, emit_warnings=False), fingerprint.current()["torch"])
        == []
    )


def test_sealing_judges_the_twin_and_imports_what_the_tables_cannot_judge(tmp_path, monkeypatch):
    def twin_of_other_semantics(d):
        _ln(d)["twin"].update(target="torch.nn.RMSNorm", kwargs={"eps": 1e-5})

    lock = kernel_lock.load(_lock(tmp_path, twin_of_other_semantics), emit_warnings=False)
    with pytest.raises(TargetNotAllowed) as exc:
        before_sealing(lock, fingerprint.current()["torch"])
    assert exc.value.key == "slots.LayerNorm.twin.target" and "computes rms_norm" in str(exc.value)
    started = _child_in_this_process(monkeypatch)
    good = kernel_lock.load(_lock(tmp_path, lambda d: None), emit_warnings=False)
    # no torch known: torch.nn's table cannot say, so a child imports
    unjudged = before_sealing(good, "")
    assert len(started) == 1  # one child for the three slots; their twins are only noted
    assert [line.split(":")[0] for line in unjudged] == [
        f"slots.{s}.twin" for s in ("LayerNorm", "RMSNorm", "Linear")
    ]
    assert all("not judged without importing it" in line for line in unjudged)
