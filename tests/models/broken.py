"""Builders whose code fails, each its own way: what a trace must name, never half-run."""

from __future__ import annotations

import torch
from torch import nn


def model_only() -> nn.Module:
    return nn.Linear(4, 4)


def not_a_module() -> tuple[str, tuple[torch.Tensor]]:
    return "model", (torch.randn(2, 4),)


def bare_args() -> tuple[nn.Module, torch.Tensor]:
    return nn.Linear(4, 4), torch.randn(2, 4)


def needs_arguments(width: int) -> tuple[nn.Module, tuple[torch.Tensor]]:
    return nn.Linear(width, width), (torch.randn(2, width),)


def raises() -> tuple[nn.Module, tuple[torch.Tensor]]:
    raise ValueError("no weights here")


def forward_raises() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return nn.Linear(4, 4), (torch.randn(2, 5),)  # a width the Linear does not take


def hangs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    import time

    time.sleep(3600)
    raise AssertionError("unreachable")


def dies() -> tuple[nn.Module, tuple[torch.Tensor]]:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


class _Holder:
    """Its ``build`` is a property that raises: the model's code runs while it is looked up."""

    @property
    def build(self) -> None:
        raise RuntimeError("looked up")


holder = _Holder()
