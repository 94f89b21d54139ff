"""kernel_probe.detect.report: `detect()`, the whole `kernel-probe env` report as plain data."""

from __future__ import annotations

import json
import sys
from importlib import metadata

import pytest

from kernel_lock import fingerprint
from kernel_lock.errors import DeviceVisibilityError
from kernel_probe.detect import libraries
from kernel_probe.detect import report as env_report
from kernel_probe.detect.libraries import KnownLibrary
from tests.kernel_probe.detect.cases import CPU, FAKES, H100, MI250X, fake_torch

pytestmark = pytest.mark.usefixtures("no_nvml")


def test_detect_without_import_checks_is_plain_data():
    report = env_report.detect(import_checks=False)
    assert tuple(report) == env_report.TOP_LEVEL_KEYS
    assert report["schema"] == env_report.SCHEMA
    assert json.loads(json.dumps(report)) == report
    assert report["fingerprint"] == fingerprint.current()  # the lock's own code, same answer
    assert report["device"]["type"] == report["fingerprint"]["device-type"]
    assert all(
        lib["import"]["status"] in ("skipped", "not-installed")
        for lib in report["libraries"].values()
    )
    assert report["errors"] == []


def test_detect_survives_a_broken_torch(monkeypatch):
    broken = fake_torch(**H100)
    broken.cuda.device_count = lambda: (_ for _ in ()).throw(
        RuntimeError("CUDA driver initialization failed")
    )
    report = env_report.detect(import_checks=False, torch=broken, nvml=lambda: None)
    assert report["device"]["type"] == "cpu"
    assert any("CUDA driver initialization failed" in e["error"] for e in report["errors"])
    json.dumps(report)


@pytest.mark.slow
def test_detect_reports_every_broken_library_and_goes_on(fakes):
    table = tuple(KnownLibrary(name, (name,), name, name) for name in FAKES)
    report = env_report.detect(
        import_checks=True,
        timeout=3,
        extra_paths=[str(fakes)],
        table=table,
        torch=fake_torch(**MI250X),
        nvml=lambda: None,
    )
    status = {name: lib["import"]["status"] for name, lib in report["libraries"].items()}
    assert status == {
        "fake_abort": "crashed",
        "fake_hang": "timeout",
        "fake_raise": "error",
        "fake_print": "ok",
        "fake_exit": "crashed",
    }
    assert all(report["libraries"][n]["import"]["reason"] for n in FAKES)
    assert report["device"]["vendor"] == "amd" and report["device"]["arch"] == "gfx90a"
    assert report["fingerprint"]["device-arch"] == "gfx90a"
    json.dumps(report)


@pytest.mark.slow
def test_liger_kernel_installed_and_importable_here():
    try:
        version = metadata.version("liger-kernel")
    except metadata.PackageNotFoundError:
        pytest.skip("liger-kernel is not installed here")
    lib = next(lib for lib in libraries.known_libraries() if lib.name == "liger-kernel")
    report = env_report.detect(import_checks=True, table=(lib,))
    entry = report["libraries"]["liger-kernel"]
    assert entry["installed"] and entry["version"] == version
    assert entry["import"]["status"] == "ok", entry["import"]
    assert entry["location"].endswith("liger_kernel")


# ---- what detect() is given, and what it does when a part fails -------------------------------
def test_detect_uses_the_table_env_and_torch_it_is_given():
    env = {"SLURM_JOB_ID": "77", "NERSC_HOST": "perlmutter"}
    report = env_report.detect(
        import_checks=False, timeout=7, env=env, table=(), torch=fake_torch(**H100)
    )
    assert report["import_checks"] == {"run": False, "timeout": 7.0}
    assert report["libraries"] == {}
    assert report["site"]["slurm"] == {"SLURM_JOB_ID": "77"}
    assert [m["signal"] for m in report["site"]["markers"]] == ["env:NERSC_HOST"]
    assert report["torch"]["version"] == "2.6.0+fake" and report["torch"]["build"] == "cuda"
    assert report["device"]["arch"] == "sm_90" and len(report["accelerators"]) == 4
    assert report["triton"]["backend"] in (
        "cuda",
        None,
    )  # inferred from this torch's build when installed
    assert report["errors"] == []


def test_detect_without_an_importable_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises
    report = env_report.detect(import_checks=False, table=())
    assert report["torch"] is None and report["fingerprint"] is None
    assert report["device"]["type"] == "cpu"
    assert [e["where"] for e in report["errors"]] == ["import torch"]
    assert report["triton"]["matches_torch_build"] is None  # no torch build to compare with


def test_detect_reports_each_failing_part_and_goes_on(monkeypatch):
    def broken(*_a, **_k):
        raise RuntimeError("part failed")

    monkeypatch.setattr(env_report.accelerators, "detect_torch_build", broken)
    monkeypatch.setattr(env_report.accelerators, "detect_accelerators", broken)
    monkeypatch.setattr(env_report.fingerprint, "current", broken)
    report = env_report.detect(import_checks=False, table=(), torch=fake_torch(**MI250X))
    assert [(e["where"], e["error"]) for e in report["errors"]] == [
        ("torch build", "RuntimeError: part failed"),
        ("accelerators", "RuntimeError: part failed"),
        ("fingerprint", "RuntimeError: part failed"),
    ]
    assert (
        report["torch"] is None and report["accelerators"] == [] and report["fingerprint"] is None
    )
    assert report["device"]["arch"] == "gfx90a"  # what did not fail is still there


def test_contradicting_visibility_variables_are_not_taken_for_a_cpu_node(monkeypatch):
    def contradiction(_torch):
        raise DeviceVisibilityError(
            "HIP_VISIBLE_DEVICES names more devices than ROCR_VISIBLE_DEVICES allows"
        )

    monkeypatch.setattr(env_report.fingerprint, "device_facts", contradiction)
    with pytest.raises(DeviceVisibilityError):
        env_report.detect(import_checks=False, table=(), torch=fake_torch(**MI250X))


# ---- which children start, and what the triton one is asked (issue 37) ---------------------------
class _Checks:
    """Stands in for ImportChecks: records each batch of requests; every import 'succeeds', no
    child."""

    batches: list[dict[str, str]]

    def __init__(self, requests, **_kw):
        self.requests = dict(requests)
        self.batches.append({name: r.probe for name, r in requests.items()})

    def results(self):
        return {
            name: {"status": "ok", "reason": "imported", "seconds": 0.1} for name in self.requests
        }

    def cancel(self):
        pass


@pytest.fixture
def batches(monkeypatch):
    _Checks.batches = []
    monkeypatch.setattr(env_report, "ImportChecks", _Checks)
    monkeypatch.setattr(
        env_report.libraries, "module_location", lambda module, _paths=(): f"/site/{module}"
    )
    return _Checks.batches


@pytest.mark.parametrize(
    "nodes, torch_kind, asked, not_asked",
    [
        ((), CPU, [{"triton": ""}], True),  # no device anywhere: the runtime is not asked
        (
            ("dev/nvidia0",),
            CPU,
            [{"triton": "triton-target"}],
            False,
        ),  # a node: asked from the start
        (("dev/kfd",), MI250X, [{"triton": "triton-target"}], False),
        (("dev/dri/renderD128",), CPU, [{"triton": "triton-target"}], False),
        (
            (),
            H100,
            [{"triton": ""}, {"triton": "triton-target"}],
            False,
        ),  # torch sees a GPU: asked after all
    ],
)
def test_triton_runtime_is_asked_for_a_target_only_where_a_gpu_may_be(
    tmp_path, batches, nodes, torch_kind, asked, not_asked
):
    for rel in nodes:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    report = env_report.detect(
        table=(), torch=fake_torch(**torch_kind), nvml=lambda: None, root=str(tmp_path)
    )
    assert batches == asked
    why = report["triton"]["target_not_asked"]
    assert (why is not None) is not_asked
    if not_asked:
        assert why.startswith("no GPU device on this node")
    json.dumps(report)


def test_a_triton_that_does_not_import_is_not_asked_again(tmp_path, batches, monkeypatch):
    monkeypatch.setattr(
        _Checks,
        "results",
        lambda self: {"triton": {"status": "crashed", "reason": "killed", "seconds": 0.1}},
    )
    report = env_report.detect(
        table=(), torch=fake_torch(**H100), nvml=lambda: None, root=str(tmp_path)
    )
    # the import itself failed: a target could not be read either
    assert batches == [{"triton": ""}]
    assert report["triton"]["import"]["status"] == "crashed"
