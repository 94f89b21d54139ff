"""On a real GPU: the real candidates through the project's own checks and timing, in float32,
bf16-true and bf16-mixed — torch.nn, torch.compile, and liger-kernel, transformer-engine and apex
where they are importable — and the verdicts users rely on.

    python -m pytest -m gpu tests/test_gpu.py -rs   # on a CUDA node (benchmarks/gpu_all.py runs it)

Skipped, with the reason, where torch sees no CUDA device. ``KP_GPU_OUT=DIR`` keeps what the suite
saw (verdicts, autocast output dtypes, timings) in DIR/gpu-verdicts.json for docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
        reason="no CUDA device here (torch.cuda.is_available() is False, or this is a ROCm "
        "build): these tests run on a CUDA GPU node (`python -m pytest -m gpu tests/test_gpu.py`, "
        "or benchmarks/gpu_all.py)",
    ),
]

from . import gpu_suite  # noqa: E402

SHAPE = "8192x1024"  # big enough to time a kernel, small enough for the suite's time limit
TORCH_NN = ("torch.layer_norm", "torch.rms_norm", "torch.linear")
LIGER_PINNED = ("liger.layer_norm", "liger.rms_norm")
OPTIONAL = {"liger": "liger_kernel", "te": "transformer_engine", "apex": "apex"}


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def reports():
    from kernel_lock.torchless import device_here

    arch = device_here().get("arch") or ""
    return gpu_suite.verdicts("cuda", arch, gpu_suite.candidates())


@pytest.fixture(scope="module")
def times(reports):
    return gpu_suite.timings("cuda", reports, SHAPE)


@pytest.fixture(scope="module")
def recorded(reports, times, tmp_path_factory) -> Path:
    out = Path(os.environ.get("KP_GPU_OUT") or tmp_path_factory.mktemp("gpu"))
    return gpu_suite.record(out / "gpu-verdicts.json", "cuda", reports, times)


@pytest.mark.parametrize("cid", TORCH_NN)
def test_torch_nn_is_accepted_in_every_regime(reports, cid):
    r = reports[cid]
    assert r.status == "accepted", r.reasons
    assert {(v.dtype, v.regime) for v in r.verdicts if v.status == "accepted"} == set(
        gpu_suite.ROWS
    )


@pytest.mark.skipif(
    not importable("liger_kernel"), reason="liger-kernel is not installed on this GPU node"
)
def test_liger_in_place_rms_norm_is_rejected_for_mutating_grad_output(reports):
    r = reports[gpu_suite.IN_PLACE_ID]
    assert r.status == "rejected", r.reasons
    assert any("grad-output-modified" in v.failed for v in r.verdicts), [
        v.failed for v in r.verdicts
    ]
    assert "modifies grad_output in place" in " ".join(r.reasons)


@pytest.mark.skipif(
    not importable("liger_kernel"), reason="liger-kernel is not installed on this GPU node"
)
@pytest.mark.parametrize("cid", LIGER_PINNED)
def test_liger_with_the_pinned_kwargs_is_accepted(reports, cid):
    r = reports[cid]
    assert r.status == "accepted", r.reasons
    if cid == "liger.rms_norm":
        assert r.candidate is not None and r.candidate.kwargs["in_place"] is False


@pytest.mark.parametrize("lib", sorted(OPTIONAL))
def test_optional_libraries_are_checked_where_importable_and_explained_where_not(reports, lib):
    mine = {cid: r for cid, r in reports.items() if cid.startswith(lib + ".")}
    assert mine, f"no {lib} candidate in the registry"
    for cid, r in mine.items():
        assert r.status == "accepted" or r.reasons, f"{cid}: {r.status} without a reason"
        if importable(OPTIONAL[lib]):  # installed: it was really checked, not waved off as missing
            assert not any("not installed" in reason for reason in r.reasons), (cid, r.reasons)
        else:
            assert r.status == "unavailable" and "not installed" in r.reasons[0], (cid, r.reasons)


def test_torch_compile_candidates_were_checked_not_skipped(reports):
    for cid in ("torch.compile.layer_norm", "torch.compile.rms_norm", "torch.compile.linear"):
        assert reports[cid].status != "skipped", (cid, reports[cid].reasons)


def test_every_accepted_candidate_records_its_output_dtype_under_autocast(reports, recorded):
    import json

    accepted = [cid for cid, r in reports.items() if r.status == "accepted"]
    dtypes = gpu_suite.autocast_dtypes(reports)
    assert set(dtypes) == set(accepted)
    assert all(d in ("float32", "bfloat16") for d in dtypes.values()), dtypes
    assert json.loads(recorded.read_text())["autocast_out_dtype"] == dtypes


def test_every_accepted_candidate_times_in_every_precision(reports, times):
    accepted = {cid for cid, r in reports.items() if r.status == "accepted"}
    assert set(times) == accepted
    for cid, rows in times.items():
        assert set(rows) == set(gpu_suite.TIMED), cid
        for precision, row in rows.items():
            assert "error" not in row, (cid, precision, row)
            assert row["median_ms"] > 0 and row["reps"] >= 10, (cid, precision, row)
            # a forward+backward cannot beat a copy of the same bytes by much (L2 is flushed by
            # rotation)
            assert 0 < row["copy_percent"] < 150 or reports[cid].semantics == "linear", (
                cid,
                precision,
                row,
            )
