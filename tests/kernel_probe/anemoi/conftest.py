from __future__ import annotations

import copy
import importlib.resources
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def shipped_check() -> Callable[[str], Any]:
    """``check_config`` (default options) on one of anemoi-training's model presets, read untouched
    from the installed package: each preset is checked once per session (a schema child and an entry
    child, ~10 s), however many tests judge it, and each test gets its own copy of the result (issue
    38)."""
    # find_spec of a submodule raises where its parent package is missing (no anemoi at all)
    if (
        importlib.util.find_spec("anemoi") is None
        or importlib.util.find_spec("anemoi.training") is None
    ):
        pytest.skip("anemoi-training is not installed; `bash .ci/anemoi-install` installs it")
    model_dir = Path(str(importlib.resources.files("anemoi.training") / "config")) / "model"
    cache: dict[str, Any] = {}

    def check(name: str) -> Any:
        from kernel_probe.anemoi.pipelines import check_config

        if name not in cache:
            cache[name] = check_config(model_dir / f"{name}.yaml")
        return copy.deepcopy(cache[name])

    return check
