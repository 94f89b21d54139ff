"""Triton (kernel_probe.detect.libraries; its entry in detect.report): which distribution owns the
triton files, its backends and its target."""

from __future__ import annotations

from importlib import metadata

import pytest

from kernel_probe.detect import libraries
from kernel_probe.detect import report as env_report
from tests.kernel_probe.detect.cases import make_dist


def _triton_tree(root, init: bytes, lib: bytes):
    (root / "triton" / "_C").mkdir(parents=True)
    (root / "triton" / "__init__.py").write_bytes(init)
    (root / "triton" / "_C" / "libtriton.so").write_bytes(lib)


ROCM_INIT, ROCM_LIB = b"__version__ = '3.1.0'\n# rocm\n", b"\x7fELF rocm build" * 10
CUDA_INIT, CUDA_LIB = b"__version__ = '3.1.0'\n", b"\x7fELF cuda build" * 20


@pytest.mark.parametrize("last_installed", ["pytorch-triton-rocm", "triton"])
def test_cuda_triton_beside_pytorch_triton_rocm(tmp_path, last_installed):
    init, lib = (
        (ROCM_INIT, ROCM_LIB) if last_installed == "pytorch-triton-rocm" else (CUDA_INIT, CUDA_LIB)
    )
    _triton_tree(tmp_path, init, lib)
    make_dist(
        tmp_path,
        "pytorch-triton-rocm",
        "3.1.0",
        [("triton/__init__.py", ROCM_INIT), ("triton/_C/libtriton.so", ROCM_LIB)],
    )
    make_dist(
        tmp_path,
        "triton",
        "3.1.0",
        [("triton/__init__.py", CUDA_INIT), ("triton/_C/libtriton.so", CUDA_LIB)],
    )
    located = libraries.locate_triton([str(tmp_path)])
    facts = env_report.triton_entry(located, None, torch_build="rocm", device_arch="gfx90a")
    assert facts["provider"] == last_installed
    # this fake's RECORD lists no backends/
    assert facts["distributions"]["triton"]["built_for"] == ["cuda"]
    assert facts["distributions"]["pytorch-triton-rocm"]["built_for"] == ["hip"]
    assert facts["conflict"] and "pytorch-triton-rocm" in facts["conflict"]
    assert facts["matches_torch_build"] is (last_installed == "pytorch-triton-rocm")
    # without an import check the backend is inferred from torch's build, and says so
    assert (facts["backend"], facts["arch"], facts["target_source"]) == (
        "hip",
        "gfx90a",
        "torch build",
    )
    assert facts["import"]["status"] == "skipped"


def test_triton_target_from_the_runtime_wins():
    located = libraries.LocatedTriton(
        "/x/triton", {"pytorch-triton-rocm": "3.1.0"}, ("pytorch-triton-rocm",), ""
    )
    imported = {
        "status": "ok",
        "reason": "imported",
        "seconds": 1.0,
        "target": {"backend": "hip", "arch": "gfx90a:sramecc+:xnack-", "warp_size": 64},
    }
    facts = env_report.triton_entry(located, imported, torch_build="rocm", device_arch="gfx90a")
    assert (facts["backend"], facts["arch"], facts["warp_size"]) == ("hip", "gfx90a", 64)
    assert (
        facts["target_source"] == "runtime"
        and facts["conflict"] is None
        and facts["matches_torch_build"]
    )
    cuda = dict(imported, target={"backend": "cuda", "arch": "90", "warp_size": 32})
    assert (
        env_report.triton_entry(located, cuda, torch_build="cuda", device_arch="sm_90")["arch"]
        == "sm_90"
    )


def test_triton_on_this_machine_matches_metadata():
    facts = env_report.triton_entry(
        libraries.locate_triton(), None, torch_build="cpu", device_arch=""
    )
    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pytest.skip("no triton distribution here")
    assert facts["installed"] and facts["provider"] == "triton" and facts["version"] == version


# ---- backends and torch's pin, from metadata ---------------------------------------------------
def _dist(root, name, version, files=(), requires=()):
    info = make_dist(root, name, version, files)
    if requires:
        with open(info / "METADATA", "a") as fh:
            fh.writelines(f"Requires-Dist: {r}\n" for r in requires)
    return metadata.Distribution.at(info)


@pytest.mark.parametrize(
    "name, files, backends",
    [
        (
            "triton",
            [("triton/__init__.py", b"")],
            ["cuda"],
        ),  # Triton 2.x: no backends/, the name says
        ("pytorch-triton-rocm", [], ["hip"]),
        ("pytorch-triton-xpu", [], ["xpu"]),
        (
            "triton",
            [("triton/backends/nvidia/driver.py", b""), ("triton/backends/amd/driver.py", b"")],
            ["cuda", "hip"],
        ),
        (
            "triton",
            [("triton/backends/nvidia/lib/x.so", b""), ("triton/backends/compiler.py", b"")],
            ["cuda"],
        ),
        ("triton", [("triton/backends/other/driver.py", b"")], ["cuda"]),  # an unknown backend dir
    ],
)
def test_backends_of(tmp_path, name, files, backends):
    assert libraries.backends_of(_dist(tmp_path, name, "3.1.0", files), name) == backends


@pytest.mark.parametrize(
    "requires, pin",
    [
        (
            ["pytorch-triton-rocm==3.1.0+cf34004b8a; platform_system == 'Linux'"],
            ("pytorch-triton-rocm", "3.1.0+cf34004b8a"),
        ),
        (["filelock", "triton==3.2.0; platform_machine == 'x86_64'"], ("triton", "3.2.0")),
        (["Pytorch-Triton-XPU===3.3.0"], ("pytorch-triton-xpu", "3.3.0")),
        (["triton>=3.0"], None),  # a range pins nothing
        (
            ["not a requirement !!", "triton==3.2.0"],
            ("triton", "3.2.0"),
        ),  # an unreadable line is skipped
        (["numpy==2.0"], None),
        ([], None),
    ],
)
def test_torch_pin(tmp_path, requires, pin):
    _dist(tmp_path, "torch", "2.6.0", requires=requires)
    assert libraries.torch_pin([str(tmp_path)]) == pin


# ---- who owns the files ------------------------------------------------------------------------
def test_the_only_distribution_owns_files_its_record_cannot_confirm(tmp_path):
    _triton_tree(tmp_path, CUDA_INIT, CUDA_LIB)
    make_dist(tmp_path, "triton", "3.1.0")  # an empty RECORD
    located = libraries.locate_triton([str(tmp_path)])
    assert located.installed and located.location == str(tmp_path / "triton")
    assert located.owners == ("triton",) and "only triton distribution" in located.owner_evidence


def test_no_owner_when_no_record_matches_the_disk(tmp_path):
    _triton_tree(tmp_path, b"__version__ = '3.2.0'\n", b"\x7fELF rebuilt")
    make_dist(
        tmp_path,
        "triton",
        "3.1.0",
        [("triton/__init__.py", CUDA_INIT), ("triton/_C/libtriton.so", CUDA_LIB)],
    )
    make_dist(tmp_path, "pytorch-triton-rocm", "3.1.0", [("triton/_C/libtriton.so", ROCM_LIB)])
    located = libraries.locate_triton([str(tmp_path)])
    assert located.owners == () and located.owner_evidence.startswith(
        "no installed distribution's RECORD"
    )
    facts = env_report.triton_entry(located, None, torch_build="cuda", device_arch="sm_90")
    assert (
        facts["provider"] is None
        and facts["version"] is None
        and facts["matches_torch_build"] is None
    )
    assert "(now: unknown)" in facts["conflict"]


# ---- the report section ------------------------------------------------------------------------
def _here(dist="triton", version="3.2.0", backends=("cuda",), pin=None):
    return libraries.LocatedTriton(
        "/site/triton", {dist: version}, (dist,), "", {dist: list(backends)}, pin
    )


@pytest.mark.parametrize(
    "pin, requires, matches, problem",
    [
        (None, None, None, None),
        (("triton", "3.2.0"), "triton==3.2.0", True, None),
        (("triton", "3.1.0"), "triton==3.1.0", False, "torch was built with triton==3.1.0, but"),
        (("pytorch-triton", "3.2.0"), "pytorch-triton==3.2.0", False, "comes from triton 3.2.0"),
    ],
)
def test_report_compares_with_torchs_pin(pin, requires, matches, problem):
    facts = env_report.triton_entry(_here(pin=pin), None, torch_build="cuda", device_arch="sm_90")
    assert (facts["torch_requires"], facts["matches_torch_pin"]) == (requires, matches)
    if problem is None:
        assert facts["torch_pin_problem"] is None
    else:
        assert problem in facts["torch_pin_problem"] and "reinstall" in facts["torch_pin_problem"]


@pytest.mark.parametrize(
    "torch_build, backends, matches, backend, arch",
    [
        ("cuda", ("cuda",), True, "cuda", "sm_90"),
        ("rocm", ("cuda",), False, "hip", "sm_90"),  # inferred from torch, whatever triton carries
        ("xpu", ("xpu",), True, "xpu", "sm_90"),
        ("cpu", ("cuda",), None, None, None),  # a CPU torch wants no Triton backend
    ],
)
def test_report_without_an_import_infers_from_torchs_build(
    torch_build, backends, matches, backend, arch
):
    facts = env_report.triton_entry(
        _here(backends=backends), None, torch_build=torch_build, device_arch="sm_90"
    )
    assert (facts["matches_torch_build"], facts["backend"], facts["arch"]) == (
        matches,
        backend,
        arch,
    )
    assert facts["import"] == {
        "status": "skipped",
        "reason": "import checks were not run",
        "seconds": None,
    }
    assert (
        facts["conflict"] is None and facts["provider"] == "triton" and facts["version"] == "3.2.0"
    )


def test_report_keeps_why_the_target_could_not_be_read():
    imported = {
        "status": "ok",
        "reason": "imported",
        "seconds": 0.4,
        "target_error": "RuntimeError: 0 active drivers",
    }
    facts = env_report.triton_entry(_here(), imported, torch_build="cuda", device_arch="sm_90")
    assert facts["target_error"] == "RuntimeError: 0 active drivers"
    assert facts["import"] == {"status": "ok", "reason": "imported", "seconds": 0.4}
    assert (facts["backend"], facts["target_source"]) == ("cuda", "torch build")


def test_report_when_triton_is_absent():
    facts = env_report.triton_entry(
        libraries.LocatedTriton(None), None, torch_build="cuda", device_arch="sm_90"
    )
    assert (
        facts["installed"] is False and facts["backend"] is None and facts["target_source"] is None
    )
    assert facts["import"] == {
        "status": "not-installed",
        "reason": "module not found",
        "seconds": None,
    }


def test_import_request_reads_the_target_only_when_installed_and_asked():
    assert env_report.triton_request("/site/triton") == env_report.ImportCheckRequest(
        "triton", probe="triton-target"
    )
    assert env_report.triton_request("/site/triton", target=False) == env_report.ImportCheckRequest(
        "triton", probe=""
    )
    assert env_report.triton_request(None) is None


# ---- the runtime is not asked for a target on a node without any GPU device (issue 37) -----------
@pytest.mark.parametrize(
    "nodes, found",
    [
        ((), []),
        (("dev/null", "dev/dri/card0"), []),  # a display-only DRM card is no render node
        (("dev/nvidia0", "dev/nvidiactl"), ["dev/nvidia0", "dev/nvidiactl"]),
        (("dev/kfd",), ["dev/kfd"]),
        (("dev/dri/renderD128",), ["dev/dri/renderD128"]),
    ],
)
def test_gpu_device_nodes_are_read_under_the_root(tmp_path, nodes, found):
    for rel in nodes:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert env_report.gpu_device_nodes(tmp_path) == [str(tmp_path / rel) for rel in found]


@pytest.mark.parametrize(
    "nodes, device_type, asked",
    [
        ((), "cpu", False),  # nothing to find a target on: not asked, and said why
        (("/dev/nvidia0",), "cpu", True),  # a device node torch cannot use (hidden, no driver): ask
        ((), "cuda", True),  # torch sees a device no node showed: ask
        ((), "rocm", True),
        (("/dev/kfd",), "rocm", True),
    ],
)
def test_the_target_is_not_asked_only_without_any_device(nodes, device_type, asked):
    why = env_report.target_not_asked(nodes, device_type)
    assert (why is None) is asked
    if not asked:
        assert why.startswith(env_report.NO_GPU) and "/dev/kfd" in why and "only the CPU" in why


@pytest.mark.parametrize("torch_build, backend", [("cuda", "cuda"), ("rocm", "hip"), ("cpu", None)])
def test_a_target_not_asked_is_said_and_inferred_from_torchs_build(torch_build, backend):
    why = env_report.target_not_asked((), "cpu")
    imported = {"status": "ok", "reason": "imported", "seconds": 0.3}
    facts = env_report.triton_entry(
        _here(backends=("cuda", "hip")),
        imported,
        torch_build=torch_build,
        device_arch="",
        not_asked=why,
    )
    assert facts["target_not_asked"] == why and facts["target_error"] is None
    assert facts["backend"] == backend and facts["arch"] is None and facts["warp_size"] is None
    assert facts["target_source"] == ("torch build" if backend else None)
    assert facts["import"] == imported


def test_a_target_read_from_the_runtime_is_never_marked_not_asked():
    imported = {
        "status": "ok",
        "seconds": 1.0,
        "target": {"backend": "cuda", "arch": "90", "warp_size": 32},
    }
    facts = env_report.triton_entry(
        _here(), imported, torch_build="cuda", device_arch="sm_90", not_asked="x"
    )
    assert facts["target_not_asked"] is None and facts["target_source"] == "runtime"
    assert (
        env_report.triton_entry(
            _here(), None, torch_build="cuda", device_arch="sm_90", not_asked="x"
        )["target_not_asked"]
        is None
    )  # no import check at all: nothing was asked of anyone


# ---- a ROCm node with PyPI's triton (moved from test_sites.py) --------------------------------
def test_pypi_triton_targets_hip_on_a_rocm_node(tmp_path):
    init, lib = b"__version__ = '3.3.1'\n", b"\x7fELF triton" * 8
    amd = b"# amd backend\n"
    (tmp_path / "triton" / "_C").mkdir(parents=True)
    (tmp_path / "triton" / "__init__.py").write_bytes(init)
    (tmp_path / "triton" / "_C" / "libtriton.so").write_bytes(lib)
    make_dist(
        tmp_path,
        "triton",
        "3.3.1",
        [
            ("triton/__init__.py", init),
            ("triton/_C/libtriton.so", lib),
            ("triton/backends/amd/driver.py", amd),
            ("triton/backends/nvidia/driver.py", amd),
        ],
    )
    # torch's ROCm wheel pins its own Triton (torch 2.7.1+rocm6.2.4 requires pytorch-triton-rocm
    # 3.3.1)
    torch_info = make_dist(tmp_path, "torch", "2.7.1+rocm6.2.4")
    with open(torch_info / "METADATA", "a") as fh:
        fh.write('Requires-Dist: pytorch-triton-rocm==3.3.1; platform_system == "Linux"\n')
    facts = env_report.triton_entry(
        libraries.locate_triton([str(tmp_path)]), None, torch_build="rocm", device_arch="gfx90a"
    )
    assert facts["distributions"]["triton"]["built_for"] == ["cuda", "hip"]
    assert facts["matches_torch_build"] is True  # it does target this GPU ...
    assert facts["torch_requires"] == "pytorch-triton-rocm==3.3.1"
    assert facts["matches_torch_pin"] is False  # ... but it is not the Triton torch was built with
    assert (
        "pytorch-triton-rocm==3.3.1" in facts["torch_pin_problem"]
        and "triton 3.3.1" in facts["torch_pin_problem"]
    )
