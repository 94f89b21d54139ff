"""kernel_probe.detect.triton: which distribution owns the triton files, its backends and its target."""

from __future__ import annotations

from importlib import metadata

import pytest

from kernel_probe.detect import triton as triton_info
from tests.kernel_probe.detect.cases import make_dist


def _triton_tree(root, init: bytes, lib: bytes):
    (root / "triton" / "_C").mkdir(parents=True)
    (root / "triton" / "__init__.py").write_bytes(init)
    (root / "triton" / "_C" / "libtriton.so").write_bytes(lib)


ROCM_INIT, ROCM_LIB = b"__version__ = '3.1.0'\n# rocm\n", b"\x7fELF rocm build" * 10
CUDA_INIT, CUDA_LIB = b"__version__ = '3.1.0'\n", b"\x7fELF cuda build" * 20


@pytest.mark.parametrize("last_installed", ["pytorch-triton-rocm", "triton"])
def test_cuda_triton_beside_pytorch_triton_rocm(tmp_path, last_installed):
    init, lib = (ROCM_INIT, ROCM_LIB) if last_installed == "pytorch-triton-rocm" else (CUDA_INIT, CUDA_LIB)
    _triton_tree(tmp_path, init, lib)
    make_dist(
        tmp_path,
        "pytorch-triton-rocm",
        "3.1.0",
        [("triton/__init__.py", ROCM_INIT), ("triton/_C/libtriton.so", ROCM_LIB)],
    )
    make_dist(tmp_path, "triton", "3.1.0", [("triton/__init__.py", CUDA_INIT), ("triton/_C/libtriton.so", CUDA_LIB)])
    located = triton_info.locate([str(tmp_path)])
    facts = triton_info.report(located, None, torch_build="rocm", device_arch="gfx90a")
    assert facts["provider"] == last_installed
    assert facts["distributions"]["triton"]["built_for"] == ["cuda"]  # this fake's RECORD lists no backends/
    assert facts["distributions"]["pytorch-triton-rocm"]["built_for"] == ["hip"]
    assert facts["conflict"] and "pytorch-triton-rocm" in facts["conflict"]
    assert facts["matches_torch_build"] is (last_installed == "pytorch-triton-rocm")
    # without an import check the backend is inferred from torch's build, and says so
    assert (facts["backend"], facts["arch"], facts["target_source"]) == ("hip", "gfx90a", "torch build")
    assert facts["import"]["status"] == "skipped"


def test_triton_target_from_the_runtime_wins():
    located = triton_info.LocatedTriton("/x/triton", {"pytorch-triton-rocm": "3.1.0"}, ("pytorch-triton-rocm",), "")
    imported = {
        "status": "ok",
        "reason": "imported",
        "seconds": 1.0,
        "target": {"backend": "hip", "arch": "gfx90a:sramecc+:xnack-", "warp_size": 64},
    }
    facts = triton_info.report(located, imported, torch_build="rocm", device_arch="gfx90a")
    assert (facts["backend"], facts["arch"], facts["warp_size"]) == ("hip", "gfx90a", 64)
    assert facts["target_source"] == "runtime" and facts["conflict"] is None and facts["matches_torch_build"]
    cuda = dict(imported, target={"backend": "cuda", "arch": "90", "warp_size": 32})
    assert triton_info.report(located, cuda, torch_build="cuda", device_arch="sm_90")["arch"] == "sm_90"


def test_triton_on_this_machine_matches_metadata():
    facts = triton_info.report(triton_info.locate(), None, torch_build="cpu", device_arch="")
    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        pytest.skip("no triton distribution here")
    assert facts["installed"] and facts["provider"] == "triton" and facts["version"] == version
