"""Functional calls routed to a lock's classes at run time (``kernel_lock.apply``): a forward
pre-hook of the module that makes the call enters a ``TorchFunctionMode``, its forward hook leaves
it; a call is routed only when its semantics at run time are the ones the lock checked. Torch is
imported only where a call is routed (the caller holds a model)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import function_site
from .slots import SPECS
from .slots.base import Functional

__all__ = ["Enter", "Leave", "Route", "Router"]


@dataclass
class Route:
    """One functional site: the semantics the lock checked, the lock's class built for it, and
    the slot and function it routes (by name: the model pickles)."""

    where: str
    semantics: Mapping[str, Any]
    module: Any
    slot: str
    function: str
    device: Any = None  # where the module's own tensors are (moved to the call's on first use)

    @property
    def functional(self) -> Functional:
        """The slot's knowledge of the function."""
        calls = SPECS[self.slot].calls
        assert calls is not None
        return calls.functions[self.function]

    def run(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """The call, on the lock's class, on the device of the call's first tensor."""
        device = next((a.device for a in args if hasattr(a, "device")), None)
        if device is not None and device != self.device:
            self.module.to(device)  # its buffers (a mask cache); its parameters are the call's
            self.device = device
        return self.functional.call(self.module, args, kwargs)


class Router:
    """The routes of one applied model, by the module that makes the call and the function's
    name, and per thread the stack of module forwards running (the innermost makes the call)."""

    def __init__(self, routes: Mapping[str, Mapping[str, list[Route]]]):
        self.routes = routes
        self.counts: dict[str, list[int]] = {}  # site -> [routed, left as written] at run time
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:  # a copy or a pickle starts with no forward running
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _frames(self) -> list[list[Any]]:
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        return frames

    def enter(self, owner: str | None) -> None:
        """A module's forward begins (``owner``: its path where it makes routed calls)."""
        frames = self._frames()
        mode = None
        if owner is not None and not any(f[2] is not None for f in frames):
            mode = _mode_class()(self)
            mode.__enter__()
        frames.append([owner, {}, mode])

    def leave(self) -> None:
        """A module's forward ends (raised or returned)."""
        frames = self._frames()
        if frames:
            mode = frames.pop()[2]
            if mode is not None:
                mode.__exit__(None, None, None)

    def handle(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``func(*args, **kwargs)``, or the lock's class where the call is a routed site's."""
        frames = self._frames()
        owner, counts = (frames[-1][0], frames[-1][1]) if frames else (None, {})
        name = getattr(func, "__name__", "")
        table = self.routes.get(owner, {}).get(name) if owner is not None else None
        if (
            not table
            or owner is None
            or not str(getattr(func, "__module__", "")).startswith("torch")
        ):
            return func(*args, **kwargs)
        n = counts[name] = counts.get(name, 0) + 1
        try:
            semantics: Any = table[0].functional.semantics(args, kwargs)
        except Exception:  # a call of a form the slot does not read: not the lock's, left as is
            semantics = None
        nth = function_site(owner, name, n)
        ordered = sorted(table, key=lambda r: r.where != nth)  # the n-th call's site first
        route = next((r for r in ordered if r.semantics == semantics), None)
        tally = self.counts.setdefault(route.where if route else nth, [0, 0])
        tally[route is None] += 1
        if route is None:
            return func(*args, **kwargs)
        return route.run(args, kwargs)


class Enter:
    """The forward pre-hook: the module's forward begins."""

    def __init__(self, router: Router, owner: str | None):
        self.router, self.owner = router, owner

    def __call__(self, module: Any, args: Any) -> None:
        self.router.enter(self.owner)


class Leave:
    """The forward hook (``always_call``: a forward that raises leaves too)."""

    def __init__(self, router: Router):
        self.router = router

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        self.router.leave()


@functools.cache
def _mode_class() -> type:
    """The TorchFunctionMode that hands every torch call to a router (made once, with torch)."""
    from torch.overrides import TorchFunctionMode  # reason: torch only once a call routes

    class _RouteMode(TorchFunctionMode):
        def __init__(self, router: Router):
            super().__init__()
            self.router = router

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self.router.handle(func, args, kwargs or {})

    return _RouteMode
