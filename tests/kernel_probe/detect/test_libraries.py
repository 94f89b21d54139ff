"""kernel_probe.detect.libraries: the known libraries, located from metadata and files, their variants told apart."""

from __future__ import annotations

import pytest

from kernel_probe.detect import importcheck, libraries
from kernel_probe.detect.libraries import KnownLibrary
from tests.kernel_probe.detect.cases import make_dist, write_pkg

APEX = next(lib for lib in libraries.known_libraries() if lib.name == "apex")
TE = next(lib for lib in libraries.known_libraries() if lib.name == "transformer-engine")


def test_pypi_apex_is_not_nvidia_apex(tmp_path):
    write_pkg(tmp_path, "apex", {"__init__.py": "# Pyramid toolkit\n", "views.py": ""})
    make_dist(
        tmp_path,
        "apex",
        "0.9.10",
        summary="Toolkit for Pyramid, a Pylons Project, to add Authentication and Authorization",
    )
    located = libraries.locate(APEX, [str(tmp_path)])
    entry = libraries.report(located, None)
    assert entry["installed"] and entry["version"] == "0.9.10" and entry["distribution"] == "apex"
    assert entry["variant"] == "unrelated"
    assert entry["identified_as"].startswith("not apex")
    assert entry["import"]["status"] == "skipped" and "not apex" in entry["import"]["reason"]
    assert libraries.import_requests({"apex": located}) == {}  # never imported


def test_nvidia_apex_is_recognised_by_its_module(tmp_path):
    write_pkg(tmp_path, "apex", {"__init__.py": "", "normalization/__init__.py": "class FusedLayerNorm: pass\n"})
    make_dist(tmp_path, "apex", "0.1")
    located = libraries.locate(APEX, [str(tmp_path)])
    assert located.variant.key == "nvidia"
    requests = libraries.import_requests({"apex": located})
    assert requests == {"apex": importcheck.ImportRequest("apex.normalization")}
    result = importcheck.check_import(requests["apex"], timeout=30, extra_paths=[str(tmp_path)])
    entry = libraries.report(located, result)
    assert entry["identified_as"] == "NVIDIA apex (CUDA)" and entry["import"]["status"] == "ok"


@pytest.mark.parametrize(
    "files, variant",
    [
        ({"__init__.py": "# This file was modified for portability to AMDGPU\nimport os\n"}, "rocm-fork"),
        ({"__init__.py": "", "_rocm_init.py": ""}, "rocm-fork"),
        ({"__init__.py": "# Copyright (c) NVIDIA CORPORATION\n"}, "nvidia"),
    ],
)
def test_transformer_engine_variant(tmp_path, files, variant):
    write_pkg(tmp_path, "transformer_engine", files)
    make_dist(tmp_path, "transformer-engine", "2.4.0")
    located = libraries.locate(TE, [str(tmp_path)])
    assert located.variant.key == variant and located.distributions == {"transformer-engine": "2.4.0"}


def test_distribution_without_module_is_not_installed(tmp_path):
    make_dist(tmp_path, "quack-kernels", "0.6.5")
    lib = KnownLibrary("quack-kernels", ("quack-kernels",), "quack_not_here_module", "quack_not_here_module")
    entry = libraries.report(libraries.locate(lib, [str(tmp_path)]), None)
    assert not entry["installed"] and entry["version"] == "0.6.5"
    assert entry["import"]["status"] == "not-installed" and "quack-kernels is installed" in entry["import"]["reason"]


def test_known_libraries_table_is_well_formed():
    names = [lib.name for lib in libraries.known_libraries()]
    assert len(names) == len(set(names))
    assert {"liger-kernel", "transformer-engine", "apex", "flash-attn", "quack-kernels", "kernels"} <= set(names)
    for lib in libraries.known_libraries():
        assert lib.check == lib.module or lib.check.startswith(lib.module + ".")
        if lib.variants:  # the last variant is the default, every other one has a marker
            assert lib.variants[-1].is_default
            assert not any(v.is_default for v in lib.variants[:-1])
