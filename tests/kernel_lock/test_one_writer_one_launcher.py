"""Issue 34: every file kernel-probe and its benchmarks write goes through the one safe writer
(``kernel_lock.files.write_file``), and every Python child starts through the one launcher
(``kernel_lock.launch``). The source is read (code inside strings too: a child's program is a
string), so a second writer or a raw ``subprocess`` start fails here; each exception left is listed
with the reason it is not one."""

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


# where a child may be started: the package, its benchmarks and the tests' helper modules (the
# GPU suite is a part of benchmarks/gpu_all.py); test modules and conftest start theirs as a test
START_SOURCES = sorted(
    {*SOURCES}
    | {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "tests").glob("*.py")
        if not p.name.startswith("test_") and p.name != "conftest.py"
    }
)
RAW_START = re.compile(
    r"\bsubprocess\.(run|Popen|call|check_call|check_output|getoutput|getstatusoutput)\("
    r"|\bPopen\(|\bfrom subprocess import\b|\bos\.(system|exec\w*|spawn\w*|posix_spawn\w*|popen)\("
    r"|\bmultiprocessing\b|\bcreate_subprocess_\w+\(|\bpty\.spawn\("
)
# file -> why its own starts are not Python children of kernel-probe (every other child, the
# benchmarks' included, starts through kernel_lock.launch: start or run)
STARTS_ALLOWED = {
    "kernel_lock/launch.py": "the one launcher itself",
    "benchmarks/gpu_facts.py": "nvidia-smi, not a Python child",
}


def test_every_child_is_started_by_the_one_launcher():
    """Issue 52: the benchmarks too (they started the CLI as a user runs it with subprocess)."""
    files = {rel for rel in START_SOURCES for _ in RAW_START.finditer((ROOT / rel).read_text())}
    assert files - set(STARTS_ALLOWED) == set(), (
        "start these through kernel_lock.launch (launch.start or launch.run)"
    )
    assert set(STARTS_ALLOWED) <= files, (
        "an allowed exception that is gone: remove it from the list"
    )
    assert any(rel.startswith("tests/") for rel in START_SOURCES)  # the helpers are scanned


@pytest.mark.parametrize(
    "line",
    [
        "subprocess.run(argv)",
        "subprocess.Popen(argv, cwd=d)",
        "subprocess.check_output(['ls'])",
        "subprocess.getoutput('ls')",
        "from subprocess import Popen as P",
        "Popen(argv)",
        "os.system('ls')",
        "os.execv(a, b)",
        "os.posix_spawn(a, b, env)",
        "import multiprocessing",
        "await asyncio.create_subprocess_exec(a)",
        "pty.spawn(argv)",
    ],
)
def test_the_scan_sees_each_kind_of_raw_start(line):
    assert RAW_START.search(line)
    assert not RAW_START.search("launch.run(argv, cwd=ROOT)") and not RAW_START.search(
        "proc: subprocess.Popen[bytes]"
    )


LAUNCH_CALL = re.compile(r"\blaunch\.(start|run)\(")
# in a benchmark, the launcher's starts are named through its module, so the folder check sees them
LAUNCH_BY_NAME = re.compile(
    r"from kernel_lock\.launch import[^\n]*\b(start|run)\b|import kernel_lock\.launch\b"
)
NOT_A_CHOSEN_FOLDER = re.compile(r"cwd=(None\b|[\"']\.?[\"']|os\.getcwd\(|Path\.cwd\(|Path\(\))")


def unchosen_folders(text: str) -> list[str]:
    """The launcher's starts in ``text`` that run in the working directory: no ``cwd=``, or one
    that names it; and an import of ``start`` or ``run`` by name (unseen by this check)."""
    found = [m[0] for m in LAUNCH_BY_NAME.finditer(text)]
    for m in LAUNCH_CALL.finditer(text):
        arguments = _arguments(text, m.end())
        if "cwd=" not in arguments or NOT_A_CHOSEN_FOLDER.search(arguments):
            found.append(m[0] + arguments + ")")
    return found


def test_every_benchmark_child_runs_in_a_folder_it_chose_never_the_working_directory():
    """Issue 52: `timing_plot.py --run` ran `python -m kernel_probe` (cwd first on its path) in the
    user's folder, and a json.py there. The benchmarks start the CLI as a user runs it (plain
    argv, PYTHONPATH kept): each start passes the folder it chose as ``cwd=``."""
    starting = set()
    for rel in START_SOURCES:
        if rel.startswith(("benchmarks/", "tests/")):
            text = (ROOT / rel).read_text()
            assert unchosen_folders(text) == [], rel
            starting |= {rel} if LAUNCH_CALL.search(text) else set()
    assert starting >= {
        f"benchmarks/{name}.py"
        for name in (
            "env_time",
            "probe_time",
            "attention_cost",
            "jobstart",
            "jobstart_scale",
            "import_cost",
            "gpu_all",
            "timing_plot",
        )
    }


@pytest.mark.parametrize(
    "text",
    [
        "launch.run(argv, env=env)",
        "launch.start(argv, cwd=None)",
        "launch.run(f(a, b), cwd='.')",
        "launch.start(argv, cwd=os.getcwd())",
        "from kernel_lock.launch import python_argv, start",
        "import kernel_lock.launch as kl",
    ],
)
def test_the_folder_check_sees_a_start_in_the_working_directory(text):
    assert unchosen_folders(text) and not unchosen_folders("launch.run(f(a), cwd=tmp, env=e)")


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
