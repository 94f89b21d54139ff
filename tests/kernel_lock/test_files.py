"""Readers while a writer writes: a reader sees the old lock or the new one, never part of one.

One process rewrites the lock in a loop (``lock.dump``: temp file, fsync, rename), alternating two
different valid locks; four processes load it in a loop meanwhile. The control run, with a writer
that writes in place in two halves, shows that the readers would notice a partial file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MINIMAL_LOCK, ROOT, run_cli, sealed_lock

READERS = 4
SECONDS = 2.0

WRITER = r"""
import sys, time
import kernel_lock
path, a, b, seconds, mode = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
locks = [kernel_lock.load(a, emit_warnings=False), kernel_lock.load(b, emit_warnings=False)]
texts = [lock.dumps() for lock in locks]
writes, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    i = writes % 2
    if mode == "atomic":
        locks[i].dump(path)
    else:  # the control: rewrite in place, in two halves
        with open(path, "w") as fh:
            fh.write(texts[i][: len(texts[i]) // 2])
            fh.flush()
            time.sleep(0.002)
            fh.write(texts[i][len(texts[i]) // 2 :])
    writes += 1
open(path + ".done", "w").write(str(writes))
"""

READER = r"""
import json, os, sys, time
import kernel_lock
path, out = sys.argv[1], sys.argv[2]
reads, failures, examples, digests = 0, 0, [], {}
deadline = time.monotonic() + 30
while not os.path.exists(path + ".done") and time.monotonic() < deadline:
    try:
        lock = kernel_lock.load(path, strict=True, emit_warnings=False)
        digests[lock.digest] = digests.get(lock.digest, 0) + 1
    except kernel_lock.LockError as exc:
        failures += 1
        if len(examples) < 5:
            examples.append(str(exc).splitlines()[0][:200])
    reads += 1
open(out, "w").write(json.dumps({"reads": reads, "failures": failures, "examples": examples,
                                 "digests": digests}))
"""


def _race(tmp_path: Path, mode: str) -> tuple[list[dict], set[str], int]:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    lock_a = sealed_lock(MINIMAL_LOCK)
    lock_b = sealed_lock(
        MINIMAL_LOCK.replace("kwargs = { bias = false }", "kwargs = { bias = true }")
    )
    lock_a.dump(a)
    lock_b.dump(b)
    assert lock_a.digest != lock_b.digest
    path = tmp_path / "kernel-lock.toml"
    lock_a.dump(path)
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "reader.py").write_text(READER)
    readers = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "reader.py"), str(path), str(tmp_path / f"r{i}.json")],
            cwd=ROOT,
        )
        for i in range(READERS)
    ]
    writer = subprocess.Popen(
        [
            sys.executable,
            str(tmp_path / "writer.py"),
            str(path),
            str(a),
            str(b),
            str(SECONDS),
            mode,
        ],
        cwd=ROOT,
    )
    procs = [writer, *readers]
    try:
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    writes = int((tmp_path / "kernel-lock.toml.done").read_text())
    results = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(READERS)]
    return results, {lock_a.digest, lock_b.digest}, writes


@pytest.mark.slow
def test_readers_never_see_a_partial_lock(tmp_path):
    results, digests, writes = _race(tmp_path, "atomic")
    assert writes > 20  # the writer really was rewriting the file all along
    for r in results:
        assert r["failures"] == 0 and r["reads"] > 50, r
        assert set(r["digests"]) <= digests and sum(r["digests"].values()) == r["reads"]
    seen = {d for r in results for d in r["digests"]}
    assert seen == digests  # the readers saw both versions: they read while it was being rewritten
    # no temp file left
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_control_a_non_atomic_writer_is_caught(tmp_path):
    # proves the test above could fail: the same readers, against a writer that is not atomic
    results, _, writes = _race(tmp_path, "in-place")
    assert writes > 50
    assert sum(r["failures"] for r in results) > 0


# ---- inputs that would hang or exhaust memory (a FIFO, /dev/zero) (hostile input, issue 14) ------
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
    assert (
        code == 5 and ("FIFO" in err or "character device" in err) and "not a regular file" in err
    ), err
