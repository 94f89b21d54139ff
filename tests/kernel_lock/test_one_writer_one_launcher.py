"""Issue 34: every file kernel-probe and its benchmarks write goes through the one safe writer
(``kernel_lock.files.write_file``), and every Python child starts through the one launcher
(``kernel_lock.launch``). The source is read (code inside strings too: a child's program is a
string), so a second writer or a raw ``subprocess`` start of ``sys.executable`` fails here; each
exception left is listed with the reason it is not one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p.relative_to(ROOT).as_posix()
    for folder in ("kernel_lock", "kernel_probe", "benchmarks")
    for p in (ROOT / folder).rglob("*.py")
)

RAW_WRITE = re.compile(
    r"\.write_text\(|\.write_bytes\(|\bjson\.dump\(|\bshutil\.(copy\w*|move)\(|\bos\.(replace|rename)\("
    r"|\bopen\([^)\n]*[\"'][wax]b?\+?[\"']"
)
# (file, what matched) -> why it is not a second writer
WRITES_ALLOWED = {
    ("kernel_lock/files.py", "os.replace("): "the one writer itself",
    # the isolation child's program imports only the standard library (it may run under another
    # interpreter, without kernel_lock): its answer goes to a file in the caller's 0700 mkdtemp
    (
        "kernel_probe/isolation/child.py",
        'open(tmp, "w"',
    ): "the child's answer, in the caller's private folder",
    (
        "kernel_probe/isolation/child.py",
        "json.dump(",
    ): "the child's answer, in the caller's private folder",
    (
        "kernel_probe/isolation/child.py",
        "os.replace(",
    ): "the child's answer, in the caller's private folder",
    (
        "kernel_probe/isolation/child.py",
        'open(d / "stdout", "wb"',
    ): "a child's output stream, in a private folder",
    (
        "kernel_probe/isolation/child.py",
        'open(d / "stderr", "wb"',
    ): "a child's output stream, in a private folder",
    (
        "benchmarks/gpu_all.py",
        'open(logs / f"{part.name}.out", "wb"',
    ): "a child's output stream (a log)",
    (
        "benchmarks/gpu_all.py",
        'open(logs / f"{part.name}.log", "wb"',
    ): "a child's output stream (a log)",
}


def _found(pattern: re.Pattern[str]) -> set[tuple[str, str]]:
    found = set()
    for rel in SOURCES:
        for m in pattern.finditer((ROOT / rel).read_text()):
            found.add((rel, m.group(0)))
    return found


def test_every_file_is_written_by_the_one_safe_writer():
    raw = _found(RAW_WRITE)
    assert {k for k in raw if k not in WRITES_ALLOWED} == set(), (
        "write these with kernel_lock.files.write_file"
    )
    assert set(WRITES_ALLOWED) <= raw, "an allowed exception that is gone: remove it from the list"


@pytest.mark.parametrize(
    "line",
    [
        'p.write_text("x")',
        "json.dump(v, fh)",
        'open(path, "w")',
        "open(p, 'ab')",
        "os.replace(a, b)",
        "shutil.copy2(a, b)",
    ],
)
def test_the_scan_sees_each_kind_of_raw_write(line):
    assert RAW_WRITE.search(line)
    assert not RAW_WRITE.search('open(path, "rb")') and not RAW_WRITE.search(
        "write_file(path, text)"
    )


RAW_START = re.compile(
    r"\bsubprocess\.(run|Popen|call|check_call|check_output)\(|\bos\.(system|exec\w*|spawn\w*|posix_spawn\w*|popen)\(|\bmultiprocessing\b"
)
# file -> why its own starts are not Python children of kernel-probe (they go through
# kernel_lock.launch otherwise)
STARTS_ALLOWED = {
    "kernel_lock/launch.py": "the one launcher itself",
    "benchmarks/gpu_facts.py": "nvidia-smi, not a Python child",
    # the benchmarks below time or trace the command a user types (`python -m kernel_probe ...`,
    # `python -c "import torch"` as the baseline), with the PYTHONPATH a sitecustomize needs: the
    # subject measured, not a child of kernel-probe (-I would drop that PYTHONPATH and change what
    # is measured)
    "benchmarks/env_time.py": "times the CLI as a user runs it",
    "benchmarks/probe_time.py": "times the CLI as a user runs it",
    "benchmarks/attention_cost.py": "times the CLI as a user runs it (from main: the Attention "
    "slot's cost)",
    "benchmarks/jobstart.py": "times and counts the CLI as a user runs it (PYTHONPATH carries "
    "the counter)",
    "benchmarks/jobstart_scale.py": "the ranks, inside the launcher's program, as srun would "
    "start them",
    "benchmarks/import_cost.py": "the one cold probe that writes the lock, as a user runs it",
    "benchmarks/gpu_all.py": "the GPU kit's parts as a user runs them (PYTHONPATH: the "
    "checkout), TERM then KILL",
}


def test_every_python_child_is_started_by_the_one_launcher():
    files = {rel for rel, _ in _found(RAW_START)}
    assert files - set(STARTS_ALLOWED) == set(), (
        "start these through kernel_lock.launch (python_argv + start)"
    )
    assert set(STARTS_ALLOWED) <= files, (
        "an allowed exception that is gone: remove it from the list"
    )
    assert not {f for f in files if f.startswith(("kernel_lock/", "kernel_probe/"))} - {
        "kernel_lock/launch.py"
    }


NOT_IN_CWD = {"benchmarks/gpu_facts.py": "nvidia-smi, not a Python child"}


def test_a_benchmarks_raw_start_runs_in_a_folder_it_chose_never_the_working_directory():
    """Issue 52: `timing_plot.py --run` ran `python -m kernel_probe` (cwd first on its path) in the
    user's folder, and a json.py there. A raw start left in benchmarks/ passes ``cwd=``."""
    for rel in sorted(STARTS_ALLOWED):
        if not rel.startswith("benchmarks/") or rel in NOT_IN_CWD:
            continue
        text = (ROOT / rel).read_text()
        for m in RAW_START.finditer(text):
            assert "cwd=" in _arguments(text, m.end()), (rel, m[0])


def _arguments(text: str, at: int) -> str:
    """The text of a call's arguments, from just after its ``(`` to the ``)`` that closes it."""
    depth = 1
    for i in range(at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[at:i]
    return text[at:]


def test_the_benchmarks_own_helper_children_use_the_launcher():
    for rel in (
        "benchmarks/import_cost.py",
        "benchmarks/jobstart_scale.py",
        "benchmarks/timing_plot.py",
    ):
        text = (ROOT / rel).read_text()
        assert "python_argv(" in text and 'sys.executable, "-c"' not in text, rel
