"""Nothing a default invents changes what a model computes (issue 53): a default gives sizes to
time at, never a semantic option; each slot's canonical values are its default class's own."""

from __future__ import annotations

import pytest

from kernel_lock.slots import SPECS
from kernel_probe.probe import planning
from kernel_probe.probe.planning import ProbeRequest, plan
from kernel_probe.slots.attention import DEFAULT_GEOMETRY, parse_geometry

CUDA = {"type": "cuda", "arch": "sm_90"}


@pytest.fixture
def gpu(monkeypatch):
    """Plan as if on a CUDA GPU (its facts), without TRITON_INTERPRET."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(planning, "detect_device", lambda: dict(CUDA))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_default_geometry_names_sizes_and_no_option(kind):
    assert parse_geometry(DEFAULT_GEOMETRY[kind]).options == ()


def test_a_gpu_probe_without_attention_pins_no_option(gpu):
    p = plan(ProbeRequest(slots=("Attention",)))
    assert p.inputs["attention"] == DEFAULT_GEOMETRY["gpu"] == "16x128x8192"
    assert "Attention" not in p.canonical  # the slot's own values: global, no softcap, no dropout
    assert SPECS["Attention"].canonical["window"] == -1
