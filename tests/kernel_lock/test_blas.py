"""The BLAS library is part of the Linear (issue 26, point 3), with a simulated switch.

No GPU here, and the CPU build refuses ``preferred_blas_library("cublaslt")``, so the switch is
simulated in-process, the way tests/kernel_probe/detect/test_sites.py simulates ROCm and CUDA nodes:
torch's own ``torch.backends.cuda.preferred_blas_library`` is replaced by a stateful stand-in that
takes torch's names and returns torch's ``_BlasBackend`` members, and offers only the libraries a
build offers (hipBLASLt is not offered on an arch torch does not support: the choice is kept, as
torch does). The probe's own code runs unchanged: the candidates from the registry,
``correctness.check`` and ``timing.time_candidate`` (the worker's handlers), the checker's verdicts,
the choice, the lock, and kernel_lock's resolver applying it. A library that computes the Linear
worse (the LUMI case: anemoi-core #560, #1041, #1042) is simulated by a ``torch.nn.Linear.forward``
that rounds its inputs to bfloat16 while that library is selected.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import kernel_lock
from kernel_lock import fingerprint, resolve, torchless
from kernel_lock.errors import LockFormatError, LockMismatch
from kernel_lock.slots import linear as blas
from kernel_probe.candidates import builtin, parse_candidate
from kernel_probe.isolation import worker
from kernel_probe.probe import correctness, handlers, onetensor, pipeline, planning, timing
from kernel_probe.probe.judge import Policy, judge_candidate
from kernel_probe.probe.report import Problem, ReportBase, static_problem
from kernel_probe.tables import CandidateDataError, TableReader

CUDA_LIBS = ("torch.linear.cublas", "torch.linear.cublaslt")
ROCM_LIBS = ("torch.linear.hipblaslt", "torch.linear.rocblas")


def cand(cid):
    return next(c for c in builtin() if c.id == cid)


class Switch:
    """torch.backends.cuda.preferred_blas_library as a build offering ``offered`` sees it."""

    def __init__(self, default="Cublas", offered=("Cublas", "Cublaslt")):
        self.state = torch._C._BlasBackend.__members__[default]
        self.offered = offered
        self.sets: list[str] = []

    def __call__(self, backend=None):
        if backend is not None:
            member = (
                torch.backends.cuda._BlasBackends[backend] if isinstance(backend, str) else backend
            )
            self.sets.append(member.name)
            if member.name in self.offered:
                self.state = member
        return self.state


@pytest.fixture
def switch(monkeypatch):
    s = Switch()
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", s)
    blas._APPLIED.clear()
    yield s
    blas._APPLIED.clear()


@pytest.fixture
def under(monkeypatch, switch):
    """Record the library in effect at every Linear call; ``bad`` libraries round the inputs to
    bf16, ``slow`` ones take 0.3 s longer at the timed shape (2048 rows; far beyond a shared
    machine's noise)."""
    seen: list[str] = []
    original = torch.nn.Linear.forward
    config = {"bad": set(), "slow": set()}

    def forward(self, x):
        name = switch.state.name
        seen.append(name)
        if name in config["slow"] and x.shape[0] == 2048:
            time.sleep(0.3)
        if name in config["bad"]:
            return torch.nn.functional.linear(
                x.bfloat16().to(x.dtype), self.weight.bfloat16().to(x.dtype), self.bias
            )
        return original(self, x)

    monkeypatch.setattr(torch.nn.Linear, "forward", forward)
    return seen, config


# ---- the candidates -----------------------------------------------------------------------------
def test_each_library_is_a_linear_candidate():
    by_id = {c.id: c for c in builtin()}
    assert {by_id[c].blas for c in CUDA_LIBS} == {"cublas", "cublaslt"}
    assert {by_id[c].blas for c in ROCM_LIBS} == {"hipblaslt", "rocblas"}
    for cid in CUDA_LIBS + ROCM_LIBS:
        c = by_id[cid]
        assert (
            c.slots == ("Linear",)
            and c.target == "torch.nn.Linear"
            and c.devices == (blas.device_of(c.blas),)
        )
        assert static_problem(c, "Linear", "cpu") == Problem(
            "unavailable", f"runs on {c.devices[0]}; this device is cpu"
        )


@pytest.mark.parametrize(
    "table, problem",
    [
        (
            {"id": "x", "slots": ["Linear"], "target": "torch.nn.Linear", "blas": "mkl"},
            "not a BLAS library",
        ),
        (
            {"id": "x", "slots": ["LayerNorm"], "target": "torch.nn.LayerNorm", "blas": "cublas"},
            "only a Linear",
        ),
    ],
)
def test_a_blas_key_is_checked(table, problem):
    with pytest.raises(CandidateDataError, match=problem):
        parse_candidate(TableReader("site.toml"), table, "candidate[0].", source="profile:site")


# ---- measured under the library, the process's choice restored -----------------------------------
def test_checked_and_timed_under_its_library(switch, under):
    seen, _ = under
    reply = correctness.check(
        cand("torch.linear.cublaslt"), "Linear", "cpu", [("float32", "true")], hidden=64
    )
    assert (reply.blas, reply.blas_default) == ("cublaslt", "cublas")
    # the candidate's calls ran under cuBLASLt, torch.nn's baseline under the classic cuBLAS (its
    # tolerance basis)
    assert set(seen) == {"Cublaslt", "Cublas"} and seen.count("Cublaslt") > seen.count("Cublas")
    assert switch.state.name == "Cublas"  # the worker serves other candidates next: restored
    seen.clear()
    rows = timing.time_candidate(
        cand("torch.linear.cublaslt"),
        "Linear",
        "cpu",
        ["128x64x32"],
        "float32",
        "true",
        {"reps": 2, "warmup": 1},
    ).rows
    assert rows[0]["blas"] == "cublaslt" and switch.state.name == "Cublas"
    # timed under it; the sampled rows' baseline
    assert seen.count("Cublaslt") >= 3 and seen.count("Cublas") == 1
    with onetensor.blas_library(cand("torch.linear"), "cuda") as (library, default):
        assert (library, default) == (
            "cublas",
            "cublas",
        )  # torch.linear: the library torch picks by itself


def test_a_library_the_build_does_not_offer_is_unavailable(monkeypatch):
    # hipBLASLt on an arch torch does not support: torch keeps rocBLAS
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", Switch(offered=("Cublas",)))
    c = cand("torch.linear.hipblaslt")
    # tensors on the CPU
    raw = correctness.check(c, "Linear", "cpu", [("float32", "true")], hidden=64)
    base = ReportBase(
        id=c.id,
        target=c.target,
        slot="Linear",
        semantics="linear",
        device="rocm",
        source="builtin",
        candidate=c,
    )
    report = judge_candidate(raw, c, "Linear", "rocm", Policy(), base)
    assert report.status == "unavailable"
    assert report.reasons == [
        "BLAS library: this torch build does not offer hipblaslt: torch kept rocblas"
    ]
    rows = timing.time_candidate(c, "Linear", "cpu", ["64x32"], "float32", "true", {"reps": 1}).rows
    assert "does not offer hipblaslt" in rows[0]["error"]


def test_a_library_that_computes_worse_is_rejected(switch, under):
    _, config = under
    config["bad"].add("Cublaslt")
    verdicts = {}
    for cid in CUDA_LIBS:
        c = cand(cid)
        raw = correctness.check(c, "Linear", "cpu", [("float32", "true")], hidden=256)
        base = ReportBase(
            id=c.id,
            target=c.target,
            slot="Linear",
            semantics="linear",
            device="cuda",
            source="builtin",
            candidate=c,
        )
        verdicts[cid] = judge_candidate(raw, c, "Linear", "cuda", Policy(), base)
    assert verdicts["torch.linear.cublas"].status == "accepted"
    bad = verdicts["torch.linear.cublaslt"]
    assert bad.status == "rejected" and any("y error" in r for r in bad.reasons)


# ---- a simulated CUDA probe: chosen, recorded, applied -------------------------------------------
class InProcessWorker:
    """The worker's handlers, run in this process on the CPU (the device is simulated)."""

    def call(self, request, timeout=0, on_progress=None):
        on_cpu = hasattr(request, "device")  # a candidate's or graph attention's request
        return handlers.dispatch(dataclasses.replace(request, device="cpu") if on_cpu else request)


class InProcessPool:
    def __init__(self, *a, **k):
        self.w = self.shared = InProcessWorker()

    def prepare(self, ahead=None):
        pass

    @contextmanager
    def worker_for(self, cand):
        yield self.w

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


H100 = {
    "device-type": "cuda",
    "device-vendor": "nvidia",
    "device-name": "NVIDIA H100 80GB HBM3",
    "device-arch": "sm_90",
    "device-features": "",
    "device-count": 1,
    "torch-cuda": "12.8",
    "driver": "570.124.06",
}


def simulated_cuda_probe(monkeypatch, tmp_path: Path, **request):
    real = fingerprint.current()
    monkeypatch.setattr(fingerprint, "current", lambda *a, **k: {**real, **H100})
    monkeypatch.setattr(
        planning,
        "detect_device",
        lambda: {"type": "cuda", "arch": "sm_90", "name": H100["device-name"], "count": 1},
    )
    monkeypatch.setattr(worker, "WorkerPool", InProcessPool)
    # the tensors are on the CPU; the BLAS libraries are the simulated CUDA device's
    monkeypatch.setattr(
        onetensor, "blas_device", lambda c, device: blas.device_of(c.blas) if c.blas else "cuda"
    )
    req = planning.ProbeRequest(
        out=tmp_path / "k.toml",
        slots=("Linear",),
        shapes=("2048x128x128",),
        precision="32-true",
        reps=5,
        plugins=False,
        **request,
    )
    p = planning.plan(req)
    offered = [c for c in p.candidates if c.id in ("torch.linear", *CUDA_LIBS, *ROCM_LIBS)]
    return pipeline.probe(dataclasses.replace(p, candidates=tuple(offered)))


@pytest.mark.slow
@pytest.mark.timing  # a choice by measured speed: runs alone under pytest-xdist (conftest)
def test_simulated_cuda_probe_chooses_and_records_the_library(monkeypatch, tmp_path, switch, under):
    _, config = under
    config["slow"].add("Cublas")  # cuBLASLt is the faster library on this simulated H100
    result = simulated_cuda_probe(monkeypatch, tmp_path)
    slot = result.lock.slots["Linear"]
    assert (
        slot.implementation == "torch.linear.cublaslt" and "faster than torch.linear" in slot.reason
    ), (slot.reason, slot.timing)
    assert slot.extra["blas"] == blas.Blas(library="cublaslt", build_default="cublas")
    assert {t["implementation"]: t["blas"] for t in slot.timing} == {
        "torch.linear": "cublas",
        "torch.linear.cublas": "cublas",
        "torch.linear.cublaslt": "cublaslt",
    }
    rocm = {c.implementation: c for c in slot.rejected if c.implementation in ROCM_LIBS}
    assert all(
        c.status == "unavailable" and "runs on rocm; this device is cuda" in c.reasons[0]
        for c in rocm.values()
    )
    text = result.lock.dumps()
    assert 'blas = { library = "cublaslt", build-default = "cublas" }' in text
    back = kernel_lock.loads(text)
    assert (
        back.slots["Linear"].extra["blas"] == slot.extra["blas"]
        and back.lock_version == kernel_lock.LOCK_VERSION
    )


@pytest.mark.slow
@pytest.mark.timing  # a choice by measured speed: runs alone under pytest-xdist (conftest)
def test_a_library_that_computes_worse_is_not_chosen(monkeypatch, tmp_path, switch, under):
    _, config = under
    config["bad"].add("Cublaslt")
    config["slow"].add("Cublas")  # faster, but wrong: never chosen
    slot = simulated_cuda_probe(monkeypatch, tmp_path).lock.slots["Linear"]
    assert slot.implementation == "torch.linear" and slot.extra["blas"] == blas.Blas(
        library="cublas", build_default="cublas"
    )
    lt = next(c for c in slot.rejected if c.implementation == "torch.linear.cublaslt")
    assert lt.status == "rejected"


# ---- kernel_lock applies it: process-wide, logged, checked at job start --------------------------
def lock_with(library, default, device="cuda"):
    text = f'''lock-version = "1.3"
created-by = "test"

[environment]
device-type = {{ value = "{device}", match = "exact" }}

[slots.Linear]
implementation = "torch.linear.{library}"
target = "torch.nn.Linear"
semantics = "linear"
kwargs = {{ bias = true }}
blas = {{ library = "{library}", build-default = "{default}" }}
'''
    return kernel_lock.loads(text, emit_warnings=False)


@pytest.fixture
def on(monkeypatch):
    def device(kind):
        monkeypatch.setattr(torchless, "for_check", lambda checked=None: {"device-type": kind})

    return device


def test_resolving_the_linear_applies_the_library(switch, on, caplog):
    on("cuda")
    lock = lock_with("cublaslt", "cublas")
    with caplog.at_level(logging.INFO, logger="kernel_lock"):
        layer = resolve.factory(lock, "Linear", verify_environment=False)(8, 4)
    assert (
        isinstance(layer, torch.nn.Linear)
        and switch.state.name == "Cublaslt"
        and switch.sets == ["Cublaslt"]
    )
    assert (
        "Linear BLAS library set to cublaslt process-wide" in caplog.text
        and "replaces cublas" in caplog.text
    )
    # again: already in effect, nothing set
    resolve.factory(lock, "Linear", verify_environment=False)
    assert switch.sets == ["Cublaslt"]


def test_a_process_that_chose_another_library_gets_a_mismatch(monkeypatch, on):
    # LUMI: the lock was probed under hipBLASLt (the default there); the job asks for rocBLAS
    # itself, as anemoi's training.preferred_blas_backend = "hipblas" does
    s = Switch(default="Cublaslt", offered=("Cublas", "Cublaslt"))
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", s)
    blas._APPLIED.clear()
    on("rocm")
    torch.backends.cuda.preferred_blas_library("hipblas")
    lock = lock_with("hipblaslt", "hipblaslt", device="rocm")
    with pytest.raises(LockMismatch) as exc:
        resolve.factory(lock, "Linear", verify_environment=False)
    assert exc.value.exit_code == 3
    text = str(exc.value)
    assert (
        "slots.Linear.blas.library" in text
        and "hipblaslt" in text
        and "rocblas (chosen by this process" in text
    )
    assert "preferred_blas_backend" in exc.value.fix
    assert s.state.name == "Cublas"  # not silently overridden
    # the same at job start: verify() sees the process's choice
    current = {k: v.value for k, v in lock.environment.fields.items()}
    with pytest.raises(LockMismatch, match="chosen by this process"):
        lock.verify(current=current)


def test_job_start_sees_an_environment_that_chooses_another_library(monkeypatch, on):
    lock = lock_with("hipblaslt", "hipblaslt", device="rocm")
    current = {k: v.value for k, v in lock.environment.fields.items()}
    monkeypatch.setenv("TORCH_BLAS_PREFER_HIPBLASLT", "0")
    # a torch-free job-start check
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=True)
    with pytest.raises(
        LockMismatch, match=r"rocblas \(asked for by TORCH_BLAS_PREFER_HIPBLASLT=0\)"
    ):
        lock.verify(current=current)
    monkeypatch.setenv("TORCH_BLAS_PREFER_HIPBLASLT", "1")  # asks for the lock's own library: fine
    assert not any("blas" in note.lower() for note in lock.verify(current=current))


def test_a_build_without_the_library_is_a_mismatch(monkeypatch, on):
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", Switch(offered=("Cublas",)))
    blas._APPLIED.clear()
    on("rocm")
    with pytest.raises(LockMismatch, match="this build does not offer it"):
        resolve.factory(
            lock_with("hipblaslt", "rocblas", device="rocm"), "Linear", verify_environment=False
        )


def test_on_another_device_type_nothing_is_applied(switch, on, caplog):
    on("cpu")  # inference of a CUDA lock on a CPU: no GPU BLAS library to set
    with caplog.at_level(logging.INFO, logger="kernel_lock"):
        resolve.factory(lock_with("cublaslt", "cublas"), "Linear", mode="inference")
    assert switch.sets == [] and "not applied" in caplog.text


def test_older_locks_load_and_leave_the_library_alone(switch, on, minimal_lock_text):
    on("cpu")
    with pytest.warns(kernel_lock.LockWarning, match="no digest"):  # the minimal lock is not sealed
        lock = kernel_lock.loads(minimal_lock_text)
    assert "blas" not in lock.slots["Linear"].extra
    resolve.factory(lock, "Linear", verify_environment=False)
    assert switch.sets == []


@pytest.mark.parametrize(
    "slot_blas, slot, problem",
    [
        ('{ library = "mkl" }', "Linear", "is not one of"),
        ('{ library = "cublaslt", build-default = "rocblas" }', "Linear", "same GPU vendor"),
        ('{ library = "cublas" }', "LayerNorm", "only the Linear slot"),
    ],
)
def test_a_bad_blas_record_is_refused(slot_blas, slot, problem):
    target, semantics = {
        "Linear": ("torch.nn.Linear", "linear"),
        "LayerNorm": ("torch.nn.LayerNorm", "layer_norm"),
    }[slot]
    text = f'''lock-version = "1.3"
created-by = "test"

[slots.{slot}]
implementation = "x"
target = "{target}"
semantics = "{semantics}"
blas = {slot_blas}
'''
    with pytest.raises(LockFormatError, match=problem) as exc:
        kernel_lock.loads(text)
    assert exc.value.key.startswith(f"slots.{slot}.blas")
