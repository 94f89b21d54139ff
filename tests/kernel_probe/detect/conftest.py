"""Fixtures of the detection tests (helpers in cases.py)."""

from __future__ import annotations

import pytest

from kernel_lock import host
from tests.kernel_probe.detect.cases import write_fakes


@pytest.fixture
def no_nvml(monkeypatch):
    """Simulations must not see a real NVML that a GPU machine may have."""
    monkeypatch.setattr(host, "nvml_devices", lambda: None)


@pytest.fixture
def fakes(tmp_path):
    """A folder of fake libraries (cases.FAKES) that abort, hang, raise, print or exit on import."""
    return write_fakes(tmp_path)
