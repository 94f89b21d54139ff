from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The suite keeps the bytecode of what it imports (tests, and the package its children import too)
# even where PYTHONDONTWRITEBYTECODE is set, as on the development machines: otherwise pytest
# rewrites every test module's asserts and every child recompiles kernel_probe on each run (5 s of
# the fast lane's collection alone). __pycache__ is ignored by git.
sys.dont_write_bytecode = False


def _end_the_worker_now() -> None:
    """The last exit handler of a pytest-xdist worker: every other handler has run (they run in the
    reverse order of registration, and this one is registered before the suite imports torch), and
    the worker has sent its results; what is left is the interpreter's own teardown of torch,
    triton and hydra, 1.4-1.7 s on 2 cores that the controlling process waits for at the end of
    every parallel run (docs/benchmarks.md). Standard streams and logging are flushed first."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a stream closed or gone: nothing left to flush
            pass
    os._exit(0)


def _threads_per_worker() -> int:
    """The cores this process may use, shared out among pytest-xdist's workers (at least one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, (cores or 1) // max(1, workers))


if os.environ.get("PYTEST_XDIST_WORKER"):
    import atexit

    atexit.register(_end_the_worker_now)
    # Each worker's torch (and the probe children it starts, which inherit the variable) computes on
    # its share of the cores, not on all of them beside the other workers: on 2 cores, two workers
    # of two threads each made the fast lane about 10 % slower (docs/benchmarks.md). Set before
    # torch is imported; a value the caller chose is kept.
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_worker()))

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
FAKES = TESTS / "fakes"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# child processes (probe workers, import checks) must see the checkout and the fake libraries too
_pp = os.environ.get("PYTHONPATH", "")
_need = [str(ROOT), str(FAKES)]
os.environ["PYTHONPATH"] = os.pathsep.join(_need + ([_pp] if _pp else []))
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))
# a test run started by a launcher (`srun pytest`) must not make the kernel-probe runs it starts
# wait for a rank 0 of that job: without their rank variable, no launcher is read
# (kernel_probe.ranks)
from kernel_probe.ranks import LAUNCHERS  # noqa: E402 (after the path set-up above)

for _launcher in LAUNCHERS:
    os.environ.pop(_launcher.rank, None)
# the fake libraries are trusted by the caller (the tests), as a user grants their own site library;
# tests of the refusal remove this
os.environ["KERNEL_LOCK_TRUST"] = (
    "kp_zoo,kp_fastlib,kp_fastnorm,kp_models,kp_notmodule,kp_not_installed,mylib"
)
# `kernel-probe env` keeps import-check answers (kernel_probe.detect.importcheck): the suite keeps
# its own, in a folder of this run, never in the user's ~/.cache
if "KERNEL_PROBE_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["KERNEL_PROBE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernel-probe-tests-cache-")

# Under pytest-xdist (`-n 2`, as .ci/run runs the suite) a test marked `timing` runs alone: its
# assertion depends on measured speed, which the other worker's work on the same cores would
# change. Every test holds a shared lock on a file of this run while it runs (set-up and teardown
# included, where module fixtures run their probes); a timing test holds it exclusively, so it
# waits for the test running beside it to end and the other worker waits for it. A turnstile
# (taken briefly by every test, held by a timing test until it has the room) keeps a stream of
# other tests from starving it. The folder is made once, here, by the controlling process: its
# workers inherit the variable, like KERNEL_PROBE_CACHE_DIR above.
if "KERNEL_PROBE_TESTS_ALONE_DIR" not in os.environ:
    import tempfile

    os.environ["KERNEL_PROBE_TESTS_ALONE_DIR"] = tempfile.mkdtemp(prefix="kernel-probe-alone-")


def _under_xdist(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _under_xdist(item.config):
        return (yield)
    import fcntl

    folder = Path(os.environ["KERNEL_PROBE_TESTS_ALONE_DIR"])
    alone = item.get_closest_marker("timing") is not None
    with open(folder / "turnstile", "a") as turnstile, open(folder / "room", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


MINIMAL_LOCK = """\
lock-version = "1.0"
created-by = "hand"

[environment]
device-type = { value = "cpu", match = "exact" }

[slots.LayerNorm]
implementation = "torch.layer_norm"
target = "torch.nn.LayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-6 }

[slots.RMSNorm]
implementation = "torch.rms_norm"
target = "torch.nn.RMSNorm"
semantics = "rms_norm"
kwargs = { eps = 1e-6 }

[slots.Linear]
implementation = "torch.linear"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = { bias = false }
"""


@pytest.fixture
def minimal_lock_text() -> str:
    return MINIMAL_LOCK


@pytest.fixture
def no_trust(monkeypatch):
    """The caller grants nothing (no $KERNEL_LOCK_TRUST): only the built-in allow-list."""
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if the probe starts any worker: the argument must be refused before any
    work."""
    from kernel_probe.isolation import worker

    def refuse(*_a, **_k):
        raise AssertionError(
            "a worker was started: the argument should have been refused before any work"
        )

    monkeypatch.setattr(worker.WorkerPool, "__init__", refuse)
    monkeypatch.setattr(worker.Worker, "__init__", refuse)


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    p = tmp_path / "kernel-lock.toml"
    p.write_text(MINIMAL_LOCK)
    return p


def edited_lock(**replace: str) -> str:
    """MINIMAL_LOCK with each old text (a key) replaced once by its new one; a missing one fails the
    test."""
    text = MINIMAL_LOCK
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def sealed_lock(text: str = MINIMAL_LOCK, *, path: str | None = None, check_targets: bool = True):
    """The lock ``text`` describes, sealed: its digest matches its content, as kernel-probe and
    `kernel-probe rehash` leave it. Loading's warnings (no digest yet, no [environment]) are not
    shown."""
    import kernel_lock

    return kernel_lock.loads(
        text, path=path, emit_warnings=False, check_targets=check_targets
    ).sealed()


def write_sealed(dest: Path, text: str = MINIMAL_LOCK, **load) -> Path:
    """``text`` sealed (:func:`sealed_lock`, ``load`` its options) and written at ``dest``; returns
    ``dest``."""
    sealed_lock(text, **load).dump(dest)
    return dest


def small_probe(
    *slots: str, shape: str = "64x32", reps: int = 2, precision: str | None = "32-true"
) -> list[str]:
    """The arguments of a small CPU probe: the given slots (all three when none), one precision
    (None: the default ones), one small shape, few repetitions. Add --out, candidates, pins and
    flags around it."""
    argv = [arg for slot in slots for arg in ("--slot", slot)]
    if precision is not None:
        argv += ["--precision", precision]
    return [*argv, "--shape", shape, "--reps", str(reps)]


def run_cli(argv, capsys):
    """Run the CLI in-process: (exit code, stdout, stderr). argparse's usage exits become codes."""
    from kernel_probe.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def run_pytest_suite(
    suite: Path, env: dict[str, str], *, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """A small pytest suite (``suite``, a folder of test modules) run in two xdist workers in a
    child, as this project's own hooks see it: this checkout and the suite importable, ``env`` added
    to this environment with ``drop``'s variables removed; output captured, 300 s at most."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", str(suite)],
        cwd=suite,
        env={
            **{k: v for k, v in os.environ.items() if k not in drop},
            **env,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{suite}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


# Module-scoped fixtures that run a real probe, a worker pool over the fake zoo or many ranks
# (seconds to minutes each, once per module). Every test using one is marked slow, so the everyday
# fast lane (`pytest -m "not slow"`, README) never starts them; .ci/run still runs everything.
SLOW_FIXTURES = {  # test module (path under tests/) -> its slow module-scoped fixtures
    "kernel_probe/probe/test_judge_zoo.py": ("results",),
    "kernel_lock/test_schema_docs.py": ("real_locks",),
    "kernel_lock/test_anemoi.py": ("locks",),
    "kernel_probe/commands/test_probe.py": ("probed", "logged_probe"),
    "kernel_lock/test_distributed.py": ("ranks",),
    "kernel_probe/jobstart/test_warm.py": ("warm",),
    "kernel_lock/test_computation_judge.py": ("probed",),
}


# Modules whose every test is slow (their `pytestmark` says so): the fast lane does not even import
# them, since importing anemoi-models and Hydra, or hypothesis (whose modules pytest rewrites),
# costs seconds.
SLOW_MODULES = (
    "kernel_lock/test_anemoi.py",
    "kernel_lock/test_anemoi_model.py",
    "kernel_lock/test_lock_fuzz.py",
    "kernel_lock/test_typed_roundtrip.py",
    "kernel_probe/test_inputs_fuzz.py",
    # validates against anemoi-training's own schemas: with anemoi installed, importing it composes
    # Hydra and builds ~200 pydantic models, seconds of the lane for tests that are all slow (issue
    # 38)
    "kernel_probe/anemoi/test_schema_check.py",
    # builds anemoi-models' GraphTransformer and Transformer processors (imports anemoi and PyG:
    # seconds)
    "kernel_probe/anemoi/test_processor_builds.py",
    "kernel_probe/anemoi/test_model_build.py",
    "kernel_probe/anemoi/test_builds.py",
    "kernel_probe/anemoi/test_recipe.py",
    "kernel_probe/model/test_calibration.py",
    "kernel_probe/model/test_check_anemoi.py",
    "kernel_probe/model/test_trace_child.py",
    "test_timing_runs_alone.py",
    "test_worker_exit.py",
)


def module_key(path) -> str:
    """A test module's name in SLOW_FIXTURES and SLOW_MODULES: its path under tests/."""
    path = Path(path)
    return path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else path.name


def pytest_ignore_collect(collection_path, config):
    if (
        module_key(collection_path) in SLOW_MODULES
        and " ".join(config.getoption("markexpr", "").split()) == "not slow"
    ):
        return True
    return None


# The modules that take longest (`pytest --durations=0`, 2026-12-05: each over 15 s of set-up, calls
# and teardown, from module fixtures, children or interpreted kernels), longest first. Under
# pytest-xdist each module runs whole on one worker (a module fixture is set up once), and these
# are handed out first, so that no worker is left running one of them alone at the end; run
# serially, the order changes nothing.
HEAVY_FIRST = (
    "kernel_probe/anemoi/test_pipelines.py",
    "kernel_probe/anemoi/test_recipe.py",
    "kernel_probe/anemoi/test_schema_check.py",
    "test_gpu_kit.py",
    "kernel_probe/commands/test_probe.py",
    "kernel_probe/probe/test_check_liger.py",
    "kernel_lock/test_anemoi.py",
    "kernel_probe/model/test_calibration.py",
    "kernel_probe/probe/test_graph_attention.py",
    "kernel_probe/probe/test_judge_effects.py",
    "kernel_probe/anemoi/test_model_build.py",
    "test_model_end_to_end.py",
    "kernel_lock/test_anemoi_model.py",
    "kernel_probe/probe/test_judge_zoo.py",
    "kernel_probe/model/test_check_anemoi.py",
    "kernel_probe/model/test_agreement.py",
    "kernel_probe/model/test_trace_child.py",
    "kernel_lock/test_anemoi_generic.py",
    "kernel_probe/anemoi/test_builds.py",
    "kernel_lock/test_blas.py",
    "kernel_probe/probe/test_in_use_slots.py",
    "kernel_probe/jobstart/test_handoff.py",
    "kernel_probe/isolation/test_worker.py",
    "kernel_probe/probe/test_in_use.py",
    "kernel_probe/probe/test_atshape.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist, whole modules to a worker, in this suite's order (HEAVY_FIRST first),
    not xdist's (most tests first)."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False
    return LoadFileScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    rank = {key: i for i, key in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(module_key(item.path), len(rank)))  # stable
    for item in items:
        if set(SLOW_FIXTURES.get(module_key(item.path), ())) & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.slow)


def _missing_anemoi() -> str | None:
    """Why anemoi-models' layers cannot be imported here (None: they can)."""
    import importlib.util

    for name in ("anemoi.models", "torch_geometric"):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:
            return name
    return None


needs_anemoi = pytest.mark.skipif(
    _missing_anemoi() is not None,
    reason="anemoi-models and PyG are not installed (README command 2 installs neither; "
    "`bash .ci/anemoi-install` does, as CI runs it)",
)
