"""Fixtures of the profile tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path
