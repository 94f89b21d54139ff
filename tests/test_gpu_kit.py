"""The GPU kit, proven on a CPU: the GPU suite collects and skips with its reason, its code paths
run on torch.nn's candidates, gpu_all.py's limits hold (a part over its limit is killed and
recorded, the others still run; the run's budget is kept), and `gpu_all.py --smoke` runs every part
and the report labels its figures SMOKE (docs/benchmarks.md)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, needs_anemoi

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_all  # noqa: E402
import gpu_report  # noqa: E402

from . import gpu_suite  # noqa: E402

needs_cpu = pytest.mark.skipif(
    __import__("torch").cuda.is_available(),
    reason="this machine has a GPU: tests/test_gpu.py runs instead",
)


@dataclass(frozen=True)
class SmokeRun:
    """One `gpu_all.py --smoke` run, shared by the tests of its parts (read-only: each test reads
    files)."""

    returncode: int
    stdout: str
    seconds: float
    run_dir: Path
    anemoi_missing: bool

    def part(self, name: str) -> dict[str, Any]:
        [part] = [
            p
            for p in json.loads((self.run_dir / "run.json").read_text())["parts"]
            if p["name"] == name
        ]
        return part

    def log(self, name: str, stream: str = "out") -> str:
        return (self.run_dir / "logs" / f"{name}.{stream}").read_text()


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> SmokeRun:
    """`gpu_all.py --smoke`, run once for this module (issue 38: its "tests" part is the GPU suite's
    collection, its "attention" part is `python -m tests.gpu_suite --smoke` with the graph-attention
    work; each ran again on its own before). No TRITON_INTERPRET: the Triton graph kernel is skipped
    on a CPU."""
    run_dir = tmp_path_factory.mktemp("gpu-all") / "run"
    try:  # what anemoi_step.py needs, as it checks it
        importlib.import_module("anemoi.models.layers.processor")
        anemoi_missing = False
    except ImportError:
        anemoi_missing = True
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(BENCH / "gpu_all.py"), "--out", str(run_dir), "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    return SmokeRun(out.returncode, out.stdout, time.perf_counter() - t0, run_dir, anemoi_missing)


@pytest.mark.slow
@needs_cpu
def test_gpu_suite_collects_and_skips_with_its_reason(smoke_run):
    # gpu_all's "tests" part: `pytest -q -p no:cacheprovider -m gpu -rs tests/test_gpu.py`, from the
    # checkout
    part = smoke_run.part("tests")
    assert part.get("command", [])[1:] == [
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "gpu",
        "-rs",
    ] + [str(ROOT / "tests" / "test_gpu.py")], part
    stdout = smoke_run.log("tests")
    assert part.get("returncode") == 0, stdout + smoke_run.log("tests", "log")
    assert "no CUDA device here" in stdout and " skipped" in stdout and "passed" not in stdout
    assert "error" not in stdout.lower()


def test_the_model_part_runs_last_with_the_cold_probes_lock(tmp_path):
    """The GPU kit's model part (issue 54): check-model with the cold probe's lock, on the GPU or,
    with --smoke, on this CPU; last, on what the budget has left."""
    for smoke in (False, True):
        run = gpu_all.parts(tmp_path, smoke)
        model = run[-1]
        assert model.name == "model" and model.argv[1] == str(BENCH / "model_check.py")
        lock = str(tmp_path / "probe" / "kernel-lock.toml")
        assert model.argv[2:] == ("--kit", "--out", str(tmp_path / "model"), "--lock", lock) + (
            ("--smoke",) if smoke else ()
        )


def test_in_place_variant_is_liger_rms_norm_with_in_place_true():
    by_id = {c.id: c for c in gpu_suite.candidates()}
    pinned, in_place = by_id["liger.rms_norm"], by_id[gpu_suite.IN_PLACE_ID]
    assert pinned.kwargs["in_place"] is False and in_place.kwargs["in_place"] is True
    assert (in_place.target, in_place.slots, in_place.devices) == (
        pinned.target,
        pinned.slots,
        pinned.devices,
    )


@pytest.mark.slow
@needs_cpu
def test_gpu_suite_code_paths_run_on_cpu(tmp_path):
    """What test_gpu.py does, on torch.nn's candidates and the in-place variant, on this CPU."""
    ids = ("torch.layer_norm", "torch.rms_norm", "torch.linear", gpu_suite.IN_PLACE_ID)
    reports = gpu_suite.verdicts("cpu", "", gpu_suite.candidates(ids))
    for cid in ids[:3]:
        r = reports[cid]
        assert r.status == "accepted", r.reasons
        assert {(v.dtype, v.regime) for v in r.verdicts if v.status == "accepted"} == set(
            gpu_suite.ROWS
        )
    in_place = reports[gpu_suite.IN_PLACE_ID]
    assert in_place.status == "unavailable" and "this device is cpu" in in_place.reasons[0]
    times = gpu_suite.timings("cpu", reports, "64x32")
    assert set(times) == set(ids[:3])
    for rows in times.values():
        assert set(rows) == set(gpu_suite.TIMED)
        assert all(row["median_ms"] > 0 and "error" not in row for row in rows.values()), rows
    dtypes = gpu_suite.autocast_dtypes(reports)
    assert set(dtypes) == set(ids[:3]) and all(dtypes.values())
    path = gpu_suite.record(tmp_path / "gpu-verdicts.json", "cpu", reports, times)
    assert json.loads(path.read_text())["autocast_out_dtype"] == dtypes


@pytest.mark.slow
@needs_cpu
def test_the_attention_part_runs_in_smoke_mode_on_cpu_and_writes_its_figures(smoke_run):
    """gpu_all.py's attention part as it runs it (issue 36): checks, then fwd+bwd figures per
    dtype."""
    part = smoke_run.part("attention")
    attention_dir = smoke_run.run_dir / "attention"
    assert part.get("command", [])[1:] == [
        "-m",
        "tests.gpu_suite",
        "--out",
        str(attention_dir),
        "--smoke",
    ], part
    stdout = smoke_run.log("attention")
    assert part.get("returncode") == 0, stdout + smoke_run.log("attention", "log")
    data = json.loads((attention_dir / "attention.json").read_text())
    assert (data["device"], data["geometry"], data["smoke"]) == (
        "cpu",
        gpu_suite.ATTENTION_SMOKE,
        True,
    )
    found = data["candidates"]
    assert set(found) == set(gpu_suite.ATTENTION_IDS)
    for cid in ("torch.sdpa", "torch.sdpa.math", "torch.sdpa.flash"):  # CPU: math and CPU flash run
        assert found[cid]["status"] == "accepted", found[cid]
        assert set(found[cid]["timings"]) == {d for d, _ in gpu_suite.ATTENTION_ROWS}
        for row in found[cid]["timings"].values():
            assert "error" not in row and row["median_ms"] > 0 and row["tflops"] > 0, row
            # no CUDA
            assert row["reps"] == gpu_suite.ATTENTION_TIMING["reps"] and row["peak_bytes"] is None
    for cid in (
        "torch.sdpa.efficient",
        "torch.sdpa.cudnn",
    ):  # they refuse CPU tensors: torch's reason
        assert (
            found[cid]["status"] == "unavailable"
            and "No viable backend" in found[cid]["reasons"][0]
        )
        assert found[cid]["timings"] == {}
    for cid in ("flash_attn.v2", "flash_attn.v3", "flash_attn.v4"):
        assert (
            found[cid]["status"] == "unavailable"
            and "this device is cpu" in found[cid]["reasons"][0]
        )
    assert "torch.sdpa.math" in stdout and "ms" in stdout
    # the gated-MLP part (issue 39), run by the same command after the attention part
    gated = json.loads((attention_dir / "gated_mlp.json").read_text())
    assert (gated["device"], gated["shape"], gated["smoke"]) == ("cpu", gpu_suite.GATED_SMOKE, True)
    assert set(gated["implementations"]) == set(gpu_suite.GATED_IMPLEMENTATIONS)
    for impl, found in gated["implementations"].items():
        assert set(found) == set(gpu_suite.GATED_IDS)
        torch_gate = found["torch.gated_mlp"]
        assert torch_gate["status"] == "accepted" and 0 < torch_gate["worst_ratio"] < 1, (
            impl,
            torch_gate,
        )
        assert (
            torch_gate["timing"]["median_ms"] > 0
            and torch_gate["timing"]["reps"] == gpu_suite.GATED_TIMING["reps"]
        )
        liger = found["liger.gated_mlp"]  # CPU: liger's kernels need a GPU, said with the reason
        assert liger["status"] == "unavailable" and "this device is cpu" in liger["reasons"][0]
        assert liger["timing"] is None
    assert "swiglu  torch.gated_mlp" in stdout


@pytest.mark.slow  # two check workers with anemoi and PyG, and the timing
@needs_cpu
@needs_anemoi
def test_the_graph_attention_work_runs_in_smoke_mode_on_cpu(smoke_run):
    """The attention part's graph-attention work (issue 39): PyG checked and timed, the Triton
    kernel skipped on a CPU with its reason (no TRITON_INTERPRET). gpu_suite.main writes what
    gpu_graph_attention.run("cpu", smoke=True) returns, first, as graph-attention.json."""
    from tests import gpu_graph_attention

    assert smoke_run.part("attention").get("returncode") == 0, smoke_run.log("attention", "log")
    data = json.loads((smoke_run.run_dir / "attention" / "graph-attention.json").read_text())
    assert "graph attention pyg     accepted" in smoke_run.log("attention")
    pyg, triton = data["backends"]["pyg"], data["backends"]["triton"]
    assert pyg["check"]["status"] == "accepted", pyg["check"]["reasons"]
    assert {v["dtype"] for v in pyg["check"]["evidence"]} == set(gpu_graph_attention.DTYPES)
    t = pyg["timing"]
    assert (
        t["median_ms"] > 0 and t["reps"] == gpu_graph_attention.REPS and t["deterministic"] is True
    )
    assert t["nodes"] == gpu_graph_attention.ga.NODES and "error" not in t
    assert triton["check"]["status"] == "skipped" and "GPU" in triton["check"]["reasons"][0]
    assert "timing" not in triton


@pytest.mark.slow  # builds the full O96-era graph (82k edges)
def test_the_o96_graph_has_the_processor_degrees():
    from tests import gpu_graph_attention

    edge_index, nodes = gpu_graph_attention.o96_graph(
        gpu_graph_attention.O96["degrees"], __import__("torch").Generator()
    )
    assert (nodes, edge_index.shape[1]) == (10242, 81900)
    degrees = __import__("torch").bincount(edge_index[1])
    assert int(degrees.min()) == 6 and int(degrees.max()) == 30


def test_the_attention_part_refuses_a_full_run_without_cuda(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has CUDA: the full attention part would run")
    with pytest.raises(SystemExit) as exc:
        gpu_suite.main(["--out", str(tmp_path)])
    assert "needs a CUDA device" in str(exc.value) and not (tmp_path / "attention.json").exists()


# ---- gpu_all.py's limits -------------------------------------------------------------------------
SLEEPER = (
    "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
    "time.sleep(120)']); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(120)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (its parent, the part, was killed first and init reaps it)
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow  # runs the kit's parts in children
def test_a_part_over_its_limit_is_killed_with_its_children_and_the_next_part_runs(tmp_path):
    pid_file = tmp_path / "child.pid"
    parts = [
        gpu_all.Part("slow", (sys.executable, "-c", SLEEPER, str(pid_file)), limit_s=1.0),
        gpu_all.Part("quick", (sys.executable, "-c", "print('quick ran')"), limit_s=60),
        gpu_all.Part("broken", (sys.executable, "-c", "raise SystemExit(7)"), limit_s=60),
    ]
    t0 = time.perf_counter()
    result = gpu_all.run_parts(parts, tmp_path, budget=300, header={"smoke": True})
    assert time.perf_counter() - t0 < 60
    status = {p["name"]: p for p in result["parts"]}
    assert status["slow"]["status"] == "timed out" and status["slow"]["returncode"] is None
    assert 1.0 <= status["slow"]["seconds"] < 30
    assert (
        status["quick"]["status"] == "ok"
        and (tmp_path / "logs" / "quick.out").read_text() == "quick ran\n"
    )
    assert status["broken"]["status"] == "failed" and status["broken"]["returncode"] == 7
    deadline = time.time() + 10
    while _alive(int(pid_file.read_text())) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(int(pid_file.read_text())), "the timed-out part's child survived"
    assert json.loads((tmp_path / "run.json").read_text())["parts"] == result["parts"]


@pytest.mark.slow  # runs the kit's parts in children
def test_the_run_budget_caps_every_part(tmp_path):
    parts = [
        gpu_all.Part("first", (sys.executable, "-c", "import time; time.sleep(60)"), limit_s=100),
        gpu_all.Part("second", (sys.executable, "-c", "pass"), limit_s=100),
    ]
    t0 = time.perf_counter()
    result = gpu_all.run_parts(parts, tmp_path, budget=1.2, header={})
    assert time.perf_counter() - t0 < 30
    first, second = result["parts"]
    # the budget, not its own 100 s
    assert first["status"] == "timed out" and first["limit_s"] <= 1.2
    assert second["status"] == "not run" and "budget" in second["reason"]


def test_gpu_limits_fit_the_eight_minute_budget(tmp_path):
    parts = gpu_all.parts(tmp_path, smoke=False)
    assert [p.name for p in parts] == [
        "probe-cold",
        "probe-warm",
        "choice",
        "anemoi",
        "tests",
        "attention",
        "model",
    ]
    # the model part (issue 54) runs last on what the others leave: the run keeps the budget
    assert sum(p.limit_s for p in parts[:-1]) <= gpu_all.GPU_BUDGET == 480
    assert gpu_suite.GATED_GPU == "40320x1024" and ("bfloat16", "mixed") in gpu_suite.GATED_ROWS


def test_bad_limit_and_only_are_refused(tmp_path):
    for argv in (["--limit", "nope=3"], ["--limit", "choice="], ["--only", "nope"]):
        with pytest.raises(SystemExit) as exc:
            gpu_all.main(["--out", str(tmp_path), "--smoke", *argv])
        assert "choice" in str(exc.value)


def test_report_refuses_a_page_without_its_markers(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("# no markers\n")
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(SystemExit) as exc:
        gpu_report.write_report(tmp_path, doc)
    assert "marker lines are missing" in str(exc.value)
    assert doc.read_text() == "# no markers\n"


@pytest.mark.parametrize("run_dir", ["missing", "empty"])
def test_report_from_no_run_is_a_usage_error_and_leaves_the_page(tmp_path, capsys, run_dir):
    """A missing directory once exited 0 and rewrote the figures to "GPU run on None, None" (issue
    34)."""
    doc = tmp_path / "page.md"
    doc.write_text(f"{gpu_report.BEGIN}\nold\n{gpu_report.END}\n")
    where = tmp_path / run_dir
    if run_dir == "empty":
        where.mkdir()
    with pytest.raises(SystemExit) as exc:
        gpu_report.write_report(where, doc)
    assert exc.value.code == 2 and "the page was not changed" in capsys.readouterr().err
    assert "old" in doc.read_text()


def test_committed_page_says_the_gpu_run_is_pending_or_shows_gpu_figures():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text.split(gpu_report.BEGIN, 1)[1].split(gpu_report.END, 1)[0]
    assert "## Runbook" in text and "gpu_wheels.sh" in text
    assert "pending" in section or "GPU run on" in section
    assert "SMOKE" not in section.split("###", 1)[0] or "not GPU results" in section


# ---- the whole smoke run, then the report --------------------------------------------------------
@pytest.mark.slow
def test_gpu_all_smoke_runs_every_part_and_reports_it_as_smoke(smoke_run, tmp_path):
    run_dir, anemoi_missing, seconds = (
        smoke_run.run_dir,
        smoke_run.anemoi_missing,
        smoke_run.seconds,
    )
    run = json.loads((run_dir / "run.json").read_text())
    status = {p["name"]: p["status"] for p in run["parts"]}
    if anemoi_missing:  # CI tolerates a failed anemoi install (.ci/run): the part fails, saying why
        assert status.pop("anemoi") == "failed" and smoke_run.returncode == 1, status
        assert "anemoi-models is not importable" in (run_dir / "logs" / "anemoi.log").read_text()
    else:
        assert smoke_run.returncode == 0, (smoke_run.stdout, status)
    assert set(status.values()) == {"ok"}, status
    # CI log: the < 3 minutes goal, on an unloaded 2-core machine
    print(f"gpu_all.py --smoke: {seconds:.0f} s")
    cold = json.loads((run_dir / "logs" / "probe-cold.out").read_text())
    warm = json.loads((run_dir / "logs" / "probe-warm.out").read_text())
    assert cold["reused"] is False and warm["reused"] is True
    choice = json.loads((run_dir / "choice" / "choice.json").read_text())
    assert choice["env"]["smoke"] is True and choice["timer"] == "cpu perf_counter"
    slots_shapes = {(r["slot"], r["shape"], r["precision"]) for r in choice["rows"]}
    compared = {
        "LayerNorm",
        "RMSNorm",
        "Linear",
        "Activation",
    }  # every default slot but Attention (its own part)
    assert {slot for slot, _, _ in slots_shapes} == compared
    assert len(slots_shapes) == len(compared) * 3 * 2
    for r in choice["rows"]:
        # a CPU: torch.nn only
        assert r["chosen"] == r["fastest"] == r["lock_choice"] and r["chosen_ratio"] == 1.0
        assert r["candidates"][r["chosen"]]["probe_ms"] > 0
    if not anemoi_missing:
        step = json.loads((run_dir / "anemoi" / "anemoi_step.json").read_text())
        assert (
            step["variants"]["torch.nn"]["step_ms"] > 0 and step["variants"]["lock"]["step_ms"] > 0
        )
        # liger cannot run on a CPU: recorded with the reason
        assert "error" in step["variants"]["liger"]
    assert "skipped" in (run_dir / "logs" / "tests.out").read_text()
    model = json.loads((run_dir / "model" / "model.json").read_text())
    assert (model["smoke"], model["device"]) == (True, "cpu")  # the model part, on this CPU
    assert model["lock"].endswith("kernel-lock.toml")  # the cold probe's lock
    checks = model["checks"]
    assert checks["README block"]["verdict"] == "agree", checks["README block"]["first"]
    assert checks["README block"]["device-why"] == "--device"
    if not anemoi_missing:
        assert checks["anemoi transformer"]["verdict"] == "agree"
        assert model["processor_ms"]["torch.nn"] > 0 and model["processor_ms"]["lock"] > 0
    attention = json.loads((run_dir / "attention" / "attention.json").read_text())
    assert attention["smoke"] is True and attention["geometry"] == gpu_suite.ATTENTION_SMOKE
    assert attention["candidates"]["torch.sdpa.math"]["timings"]["float16"]["median_ms"] > 0

    doc = tmp_path / "benchmarks.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    gpu_report.write_report(run_dir, doc)
    text = doc.read_text()
    section = text.split(gpu_report.BEGIN, 1)[1].split(gpu_report.END, 1)[0]
    assert "## Runbook" in text.split(gpu_report.BEGIN)[0]  # the page around the markers is kept
    assert "## Figures: SMOKE" in section and "not GPU results" in section
    assert "GPU run on" not in section
    assert "| choice | ok |" in section and "torch.layer_norm" in section
    pngs = (
        sorted((tmp_path / "benchmarks").glob("*.png"))
        if (tmp_path / "benchmarks").exists()
        else []
    )
    if pngs:  # matplotlib present: one PNG per slot, named as smoke
        assert [p.name for p in pngs] == sorted(f"smoke-{slot}.png" for slot in compared)
    else:
        assert "text charts" in section and "LayerNorm: % of copy bandwidth" in section


def test_report_sections_from_a_gpu_shaped_record():
    """The non-smoke paths of the report, on a hand-made record (invented numbers, no figure of
    ours)."""
    choice = {
        "goal": 1.03,
        "rows": [
            {
                "slot": "LayerNorm",
                "shape": "40320x1024",
                "precision": "32-true",
                "chosen": "torch.layer_norm",
                "lock_choice": "torch.layer_norm",
                "fastest": "liger.layer_norm",
                "chosen_ratio": 1.10,
                "lock_choice_ratio": 1.10,
                "candidates": {
                    "torch.layer_norm": {"ms": 1.1, "copy_percent": 40.0, "probe_ms": 1.0},
                    "liger.layer_norm": {"ms": 1.0, "copy_percent": 44.0, "probe_ms": 1.05},
                },
            }
        ],
    }
    table = "\n".join(gpu_report.choice_table(choice))
    assert "| 1.100 | **no** |" in table
    anchor = {"env": {"device": "X"}, "copy": {"GBps": 1.0}}
    anchor["norms"] = [
        {
            "name": "liger.LigerLayerNorm",
            "N": 40320,
            "D": 1024,
            "dtype": "float32",
            "fwdbwd_ms": 0.5,
            "fwdbwd_pct_copy": 38,
        }
    ]
    assert (
        "| liger.layer_norm | 40320x1024 | 32-true | 0.500 ms (38 %) | 1.000 ms (44 %) | 2.00 |"
        in "\n".join(gpu_report.anchor_lines(anchor, choice))
    )
    step = {
        "variants": {
            "torch.nn": {"step_ms": 1000.0},
            "lock": {"measured_delta_ms": -10.0, "predicted_delta_ms": -8.0},
        }
    }
    meaning = "\n".join(gpu_report.meaning(choice, step, smoke=False))
    assert "within 3 % of the fastest accepted candidate in 0 of 1" in meaning
    assert "-10.0 ms (-1.0 %)" in meaning and "predicted -8.0 ms" in meaning
    chart = "\n".join(
        gpu_report.text_chart("LayerNorm", gpu_report.series(choice)["LayerNorm"], "GPU")
    )
    assert "liger.layer_norm" in chart and "44.0 %" in chart


def test_a_rerun_of_one_part_keeps_the_others_records():
    earlier = {
        "smoke": False,
        "budget_s": 480,
        "parts": [{"name": "a", "seconds": 10.0}, {"name": "b", "seconds": 5.0}],
    }
    rerun = {"parts": [{"name": "b", "seconds": 7.0, "status": "ok"}]}
    merged = gpu_all.merge_rerun(earlier, rerun)
    assert [p["name"] for p in merged["parts"]] == ["a", "b"]
    assert merged["parts"][1] == {"name": "b", "seconds": 7.0, "status": "ok", "rerun": True}
    assert merged["seconds"] == 17.0 and merged["budget_s"] == 480


def test_the_sizing_table_states_the_limits_gpu_all_uses(tmp_path):
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for part in gpu_all.parts(tmp_path, smoke=False):
        row = next(line for line in text.splitlines() if line.startswith(f"| {part.name} |"))
        assert row.rstrip(" |").endswith(f"{part.limit_s:g} s"), (part.name, row)
