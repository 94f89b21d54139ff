"""kernel_probe/anemoi/children.py: the child side of reading a config (the layer_kernels paths of a
composed tree, and the guard that refuses an untrusted ``pkg://`` search path before Hydra imports
it). The composition itself runs Hydra (tests/kernel_probe/anemoi/test_pipelines.py and
test_schema_check.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kernel_probe.anemoi.children import UNTRUSTED_SEARCH_PATH, UntrustedSearchPath, _get
from kernel_probe.anemoi.config import layer_kernels_paths


@pytest.mark.parametrize(
    "node,paths",
    [
        ({}, []),
        ({"layer_kernels": {"layer_kernels": {}}}, [("layer_kernels",)]),  # not looked into
        (
            {
                "model": {
                    "layer_kernels": 1,
                    "processor": {"layer_kernels": 2},
                    "encoders": {"0": {"layer_kernels": 3}},
                }
            },
            [
                ("model", "layer_kernels"),
                ("model", "processor", "layer_kernels"),
                ("model", "encoders", "0", "layer_kernels"),
            ],
        ),
        (
            [{"layer_kernels": None}, "x", [{"layer_kernels": 1}]],
            [("0", "layer_kernels"), ("2", "0", "layer_kernels")],
        ),
        ({0: {"layer_kernels": 1}}, [("0", "layer_kernels")]),  # an int key, as a string
        ("layer_kernels", []),
    ],
)
def test_layer_kernels_paths(node, paths):
    assert list(layer_kernels_paths(node)) == paths


def test_get_follows_keys_and_list_indices():
    tree = {"model": {"encoders": [{"layer_kernels": {"Linear": 1}}]}}
    assert _get(tree, ("model", "encoders", "0", "layer_kernels")) == {"Linear": 1}
    with pytest.raises(KeyError):
        _get(tree, ("model", "decoders"))


def test_the_exception_name_is_what_the_parent_matches():
    assert UntrustedSearchPath.__name__ == UNTRUSTED_SEARCH_PATH


@pytest.fixture
def guarded(monkeypatch):
    """guard_search_paths on a stand-in for Hydra's ConfigRepository (the real one is restored
    after)."""
    pytest.importorskip(
        "hydra", reason="hydra-core is not installed; `bash .ci/anemoi-install` installs it"
    )
    from hydra._internal.config_repository import ConfigRepository

    from kernel_probe.anemoi.children import guard_search_paths

    seen: list = []
    monkeypatch.setattr(
        ConfigRepository, "initialize_sources", lambda self, path: seen.append(path)
    )
    guard_search_paths(("hydra.conf", "anemoi.training", "kp_zoo"))

    def initialize(*paths: str):
        search = SimpleNamespace(
            get_path=lambda: [SimpleNamespace(path=p, provider="user") for p in paths]
        )
        ConfigRepository.initialize_sources(object(), search)
        return search

    return initialize, seen


@pytest.mark.parametrize(
    "path,why",
    [
        ("pkg://kp_evil", "it is not trusted"),
        ("pkg://anemoi", "it is not trusted"),  # a parent of a trusted package is not trusted
        ("pkg://kp_zoo/_private", "a private or __main__ module is never imported"),
        ("pkg://unittest/__main__", "a private or __main__ module is never imported"),
    ],
)
def test_an_untrusted_search_path_is_refused_before_hydra_sees_it(guarded, path, why):
    initialize, seen = guarded
    with pytest.raises(UntrustedSearchPath) as exc:
        initialize("file:///tmp/conf", path)
    assert f"search path {path} (from user)" in str(exc.value) and why in str(exc.value)
    assert "nothing was imported" in str(exc.value) and seen == []


def test_trusted_search_paths_reach_hydra(guarded):
    initialize, seen = guarded
    search = initialize(
        "file:///tmp/conf", "pkg://anemoi.training/config", "pkg://kp_zoo/conf", "pkg://hydra.conf"
    )
    assert seen == [search]
