from __future__ import annotations

import copy
import importlib.resources
import importlib.util
from pathlib import Path
from typing import Any

import pytest


class ShippedCheck:
    """``check_config`` (default options) on anemoi-training's model presets, read untouched from
    the installed package: each preset is checked once per session however many tests judge it,
    and each test gets its own copy of the result (issue 38). :meth:`prefill` checks several at
    once, through ``check_configs`` (one child for their schemas and entries, issue 51)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.cache: dict[str, Any] = {}

    def prefill(self, names: list[str]) -> None:
        from kernel_probe.anemoi.pipelines import check_configs

        missing = [n for n in names if n not in self.cache]
        if not missing:
            return
        results = check_configs([self.model_dir / f"{n}.yaml" for n in missing])
        self.cache.update(zip(missing, results, strict=True))

    def __call__(self, name: str) -> Any:
        self.prefill([name])
        return copy.deepcopy(self.cache[name])


@pytest.fixture(scope="session")
def shipped_check() -> ShippedCheck:
    """A :class:`ShippedCheck` for this session; a skip where anemoi-training is not installed."""
    # find_spec of a submodule raises where its parent package is missing (no anemoi at all)
    if (
        importlib.util.find_spec("anemoi") is None
        or importlib.util.find_spec("anemoi.training") is None
    ):
        pytest.skip("anemoi-training is not installed; `bash .ci/anemoi-install` installs it")
    return ShippedCheck(
        Path(str(importlib.resources.files("anemoi.training") / "config")) / "model"
    )
