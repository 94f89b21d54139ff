"""kernel_probe.detect.libraries: the known libraries, located from metadata and files, their
variants told apart."""

from __future__ import annotations

import sys

import pytest

from kernel_probe.detect import importcheck, libraries
from kernel_probe.detect import report as env_report
from kernel_probe.detect.libraries import KnownLibrary
from kernel_probe.tables import CandidateDataError, TableReader
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
    entry = env_report.library_entry(located, None)
    assert entry["installed"] and entry["version"] == "0.9.10" and entry["distribution"] == "apex"
    assert entry["variant"] == "unrelated"
    assert entry["identified_as"].startswith("not apex")
    assert entry["import"]["status"] == "skipped" and "not apex" in entry["import"]["reason"]
    assert env_report.import_requests({"apex": located}) == {}  # never imported


def test_nvidia_apex_is_recognised_by_its_module(tmp_path):
    write_pkg(
        tmp_path,
        "apex",
        {"__init__.py": "", "normalization/__init__.py": "class FusedLayerNorm: pass\n"},
    )
    make_dist(tmp_path, "apex", "0.1")
    located = libraries.locate(APEX, [str(tmp_path)])
    assert located.variant.key == "nvidia"
    requests = env_report.import_requests({"apex": located})
    assert requests == {"apex": importcheck.ImportCheckRequest("apex.normalization")}
    result = importcheck.check_import(requests["apex"], timeout=30, extra_paths=[str(tmp_path)])
    entry = env_report.library_entry(located, result)
    assert entry["identified_as"] == "NVIDIA apex (CUDA)" and entry["import"]["status"] == "ok"


@pytest.mark.parametrize(
    "files, variant",
    [
        (
            {"__init__.py": "# This file was modified for portability to AMDGPU\nimport os\n"},
            "rocm-fork",
        ),
        ({"__init__.py": "", "_rocm_init.py": ""}, "rocm-fork"),
        ({"__init__.py": "# Copyright (c) NVIDIA CORPORATION\n"}, "nvidia"),
    ],
)
def test_transformer_engine_variant(tmp_path, files, variant):
    write_pkg(tmp_path, "transformer_engine", files)
    make_dist(tmp_path, "transformer-engine", "2.4.0")
    located = libraries.locate(TE, [str(tmp_path)])
    assert located.variant.key == variant and located.distributions == {
        "transformer-engine": "2.4.0"
    }


def test_distribution_without_module_is_not_installed(tmp_path):
    make_dist(tmp_path, "quack-kernels", "0.6.5")
    lib = KnownLibrary(
        "quack-kernels", ("quack-kernels",), "quack_not_here_module", "quack_not_here_module"
    )
    entry = env_report.library_entry(libraries.locate(lib, [str(tmp_path)]), None)
    assert not entry["installed"] and entry["version"] == "0.6.5"
    assert (
        entry["import"]["status"] == "not-installed"
        and "quack-kernels is installed" in entry["import"]["reason"]
    )


def test_known_libraries_table_is_well_formed():
    names = [lib.name for lib in libraries.known_libraries()]
    assert len(names) == len(set(names))
    assert {
        "liger-kernel",
        "transformer-engine",
        "apex",
        "flash-attn",
        "quack-kernels",
        "kernels",
    } <= set(names)
    for lib in libraries.known_libraries():
        assert lib.check == lib.module or lib.check.startswith(lib.module + ".")
        if lib.variants:  # the last variant is the default, every other one has a marker
            assert lib.variants[-1].is_default
            assert not any(v.is_default for v in lib.variants[:-1])


def test_every_registry_candidate_maps_to_a_library_by_its_top_level_package():
    """Issue 52: apex's candidates (module apex.normalization) and flash_attn.v4 (flash_attn.cute)
    mapped to no library, so a lock never recorded them and installing apex left it current."""
    from kernel_probe import candidates as cands
    from kernel_probe.isolation.worker import torch_own

    offered = cands.builtin()
    mapped = {cid: name for name, ids in libraries.by_library(offered).items() for cid in ids}
    assert {c.id for c in offered if not torch_own(c)} == set(mapped)
    assert mapped["apex.layer_norm"] == mapped["apex.rms_norm"] == "apex"
    assert mapped["flash_attn.v4"] == "flash-attn"
    for c in offered:  # the library's top-level module is the candidate's, its distribution one
        if c.id in mapped:
            lib = libraries.known(mapped[c.id])
            assert lib is not None and (c.module or c.target).split(".")[0] == lib.module
            assert not c.distribution or c.distribution in lib.distributions


# ---- the [[library]] tables --------------------------------------------------------------------
def _read(d):
    return libraries.read_libraries(TableReader("registry.toml"), d)


def test_read_libraries_reads_every_key():
    (lib,) = _read(
        {
            "library": [
                {
                    "name": "apex",
                    "distributions": ["apex", "nvidia-apex"],
                    "module": "apex",
                    "check": "apex.normalization",
                    "about": "NVIDIA apex",
                    "variant": [
                        {
                            "key": "nvidia",
                            "label": "NVIDIA apex",
                            "has-any": "normalization/__init__.py",
                        },
                        {"key": "rocm", "label": "ROCm apex", "text-in": [["__init__.py", "ROCm"]]},
                        {"key": "other", "label": "not apex", "usable": False},
                    ],
                }
            ]
        }
    )
    assert lib == KnownLibrary(
        "apex",
        ("apex", "nvidia-apex"),
        "apex",
        "apex.normalization",
        variants=(
            libraries.Variant("nvidia", "NVIDIA apex", has_any=("normalization/__init__.py",)),
            libraries.Variant("rocm", "ROCm apex", text_in=(("__init__.py", "ROCm"),)),
            libraries.Variant("other", "not apex", usable=False),
        ),
        about="NVIDIA apex",
    )
    assert [v.is_default for v in lib.variants] == [False, False, True]


def test_read_libraries_of_an_empty_registry():
    assert _read({}) == ()


LIB = {"name": "x", "module": "x", "check": "x"}


@pytest.mark.parametrize(
    "library, key, problem",
    [
        ({**LIB, "modul": "x"}, "library[0].modul", "unknown key 'modul'"),
        ({"module": "x", "check": "x"}, "library[0].name", "required key is missing"),
        ({"name": "x", "module": "x"}, "library[0].check", "required key is missing"),
        ({**LIB, "distributions": "x"}, None, None),  # a lone string is a list of one: no error
        ({**LIB, "distributions": [1]}, "library[0].distributions[0]", "expected string, got int"),
        (
            {**LIB, "variant": [{"key": "k"}]},
            "library[0].variant[0].label",
            "required key is missing",
        ),
        (
            {**LIB, "variant": [{"key": "k", "label": "l", "hasany": []}]},
            "library[0].variant[0].hasany",
            "unknown",
        ),
        (
            {**LIB, "variant": [{"key": "k", "label": "l", "text-in": [["only-a-file"]]}]},
            "library[0].variant[0].text-in",
            "expected a list of [file, text] pairs",
        ),
        (
            {**LIB, "variant": [{"key": "k", "label": "l", "usable": "no"}]},
            "library[0].variant[0].usable",
            "expected true or false",
        ),
    ],
)
def test_read_libraries_errors_name_the_dotted_key(library, key, problem):
    if key is None:
        assert _read({"library": [library]})[0].distributions == ("x",)
        return
    with pytest.raises(CandidateDataError) as info:
        _read({"library": [library]})
    assert (info.value.path, info.value.key) == ("registry.toml", key)
    assert problem in info.value.problem


# ---- telling variants apart --------------------------------------------------------------------
VARIANTS = (
    libraries.Variant("nvidia", "NVIDIA", has_any=("normalization/__init__.py", "csrc")),
    libraries.Variant("rocm", "ROCm", text_in=(("__init__.py", "AMDGPU"), ("version.py", "rocm"))),
)


@pytest.mark.parametrize(
    "files, variants, key",
    [
        ({"__init__.py": "", "normalization/__init__.py": ""}, VARIANTS, "nvidia"),
        ({"__init__.py": "", "csrc/x.cu": ""}, VARIANTS, "nvidia"),
        ({"__init__.py": "# for AMDGPU\n"}, VARIANTS, "rocm"),
        ({"__init__.py": "", "version.py": "build = 'rocm6.2'\n"}, VARIANTS, "rocm"),
        ({"__init__.py": "# nothing known\n"}, VARIANTS, None),  # no default: nothing recognised
        ({"__init__.py": ""}, (*VARIANTS, libraries.Variant("plain", "plain")), "plain"),
        ({"__init__.py": "AMDGPU", "csrc/a": ""}, VARIANTS, "nvidia"),  # the first match wins
    ],
)
def test_recognise(tmp_path, files, variants, key):
    write_pkg(tmp_path, "lib", files)
    found = libraries.recognise(variants, str(tmp_path / "lib"))
    assert (found.key if found else None) == key


def test_recognise_a_single_module_file_only_by_default(tmp_path):
    module = tmp_path / "lib.py"
    module.write_text("AMDGPU\n")
    assert libraries.recognise(VARIANTS, str(module)) is None
    default = libraries.Variant("plain", "plain")
    assert libraries.recognise((*VARIANTS, default), str(module)) is default


# ---- where a module is, and which imports are worth a child ------------------------------------
def test_module_location_prefers_the_extra_paths(tmp_path):
    write_pkg(tmp_path, "kp_detect_probe_pkg", {"__init__.py": ""})
    (tmp_path / "kp_detect_probe_mod.py").write_text("")
    assert libraries.module_location("kp_detect_probe_pkg", [str(tmp_path)]) == str(
        tmp_path / "kp_detect_probe_pkg"
    )
    assert libraries.module_location("kp_detect_probe_mod", [str(tmp_path)]) == str(
        tmp_path / "kp_detect_probe_mod.py"
    )
    assert libraries.module_location("kp_detect_probe_pkg") is None  # not on sys.path
    assert libraries.module_location("json").endswith("json")  # the normal finders otherwise


def test_search_path_puts_the_extra_paths_first(tmp_path):
    assert libraries.search_path([tmp_path]) == [str(tmp_path), *sys.path]


def _located(name, *, installed=True, variant=None, dists=None):
    lib = KnownLibrary(name, (name,), name, f"{name}.ops")
    return libraries.Located(lib, dists or {}, f"/site/{name}" if installed else None, variant)


def test_import_requests_skip_what_is_absent_or_a_namesake():
    located = {
        "a": _located("a"),
        "b": _located("b", installed=False, dists={"b": "1.0"}),
        "c": _located("c", variant=libraries.Variant("pypi", "a namesake", usable=False)),
        "d": _located("d", variant=libraries.Variant("nvidia", "NVIDIA", has_any=("x",))),
    }
    assert env_report.import_requests(located) == {
        "a": importcheck.ImportCheckRequest("a.ops"),
        "d": importcheck.ImportCheckRequest("d.ops"),
    }


def test_report_takes_the_import_check_as_it_came():
    imported = {"status": "error", "reason": "OSError: bad .so", "seconds": 0.5}
    entry = env_report.library_entry(_located("a", dists={"a": "1.2", "a-cu12": "1.3"}), imported)
    assert entry["import"] == imported and entry["import"] is not imported
    assert (entry["distribution"], entry["version"]) == ("a", "1.2")  # the preferred one
    assert entry["distributions"] == {"a": "1.2", "a-cu12": "1.3"}
    assert (entry["check_module"], entry["location"], entry["variant"]) == (
        "a.ops",
        "/site/a",
        None,
    )


def test_report_of_a_library_not_installed_at_all():
    entry = env_report.library_entry(_located("z", installed=False), None)
    assert (
        entry["installed"] is False and entry["version"] is None and entry["distribution"] is None
    )
    assert entry["import"] == {
        "status": "not-installed",
        "reason": "module not found",
        "seconds": None,
    }


def test_locate_all_uses_the_table_given(tmp_path):
    write_pkg(tmp_path, "kp_detect_probe_pkg", {"__init__.py": ""})
    make_dist(tmp_path, "kp-detect-probe-pkg", "0.3")
    table = (
        KnownLibrary(
            "probe-pkg", ("kp-detect-probe-pkg",), "kp_detect_probe_pkg", "kp_detect_probe_pkg"
        ),
    )
    located = libraries.locate_all(table, [str(tmp_path)])
    assert list(located) == ["probe-pkg"]
    assert located["probe-pkg"].installed and located["probe-pkg"].distributions == {
        "kp-detect-probe-pkg": "0.3"
    }
    assert libraries.locate_all((), [str(tmp_path)]) == {}


# ---- ROCm forks (moved from test_sites.py) ----------------------------------------------------
def test_rocm_forks_are_labelled_as_forks(tmp_path):
    write_pkg(
        tmp_path,
        "apex",
        {
            "__init__.py": "",
            "normalization/__init__.py": "",
            "git_version_info.py": "# Modified for ROCm Apex\n",
            "op_builder/__init__.py": "",
        },
    )
    apex = next(lib for lib in libraries.known_libraries() if lib.name == "apex")
    entry = env_report.library_entry(libraries.locate(apex, [str(tmp_path)]), None)
    assert entry["variant"] == "rocm-fork" and "NVIDIA" not in entry["identified_as"]
    te_root = tmp_path / "te"
    write_pkg(
        te_root,
        "transformer_engine",
        {
            "__init__.py": "# This file was modified for portability to AMDGPU\n",
            "pytorch/__init__.py": "",
            "_rocm_init.py": "",
        },
    )
    make_dist(te_root, "transformer-engine", "2.4.0")
    te = next(lib for lib in libraries.known_libraries() if lib.name == "transformer-engine")
    entry = env_report.library_entry(libraries.locate(te, [str(te_root)]), None)
    assert entry["variant"] == "rocm-fork" and "NVIDIA" not in entry["identified_as"]
