"""The report of ``kernel-probe env`` (``detect()``; keys in docs/env.md): every detected fact, as
plain data; device and fingerprint from ``kernel_lock.fingerprint``, as the lock's. Triton's
target is asked of its runtime only where a GPU may be (elsewhere it costs 1.5 s to end in "0
active drivers"): else it is inferred from torch's build, and ``target_not_asked`` says why."""

from __future__ import annotations

import functools
import glob
import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kernel_lock import fingerprint
from kernel_lock import host as lock_host
from kernel_lock.errors import DeviceVisibilityError
from kernel_lock.host import normalize_gcn_arch
from kernel_probe import __version__
from kernel_probe.anemoi.versions import torch_pin_notes
from kernel_probe.detect import accelerators, host, libraries
from kernel_probe.detect.accelerators import NvmlList, failure
from kernel_probe.detect.importcheck import (
    DEFAULT_TIMEOUT,
    ImportCache,
    ImportCheckRequest,
    ImportChecks,
    close_calls,
    load_per_core,
    scaled_timeout,
)
from kernel_probe.detect.libraries import (
    TRITON,
    TRITON_DISTRIBUTIONS,
    KnownLibrary,
    Located,
    LocatedTriton,
)

SCHEMA = "kernel-probe-env/1"
TOP_LEVEL_KEYS = (
    ("schema", "kernel_probe", "seconds", "import_checks", "host", "torch", "device")
    + ("accelerators", "triton", "libraries", "site")
    + ("fingerprint", "errors")
)
# what device_facts sees when torch cannot be imported: no GPU runtime, so it answers for the CPU
_NO_TORCH = SimpleNamespace(version=SimpleNamespace(cuda=None, hip=None))
NOT_RUN = {"status": "skipped", "reason": "import checks were not run", "seconds": None}
BACKEND_FOR_TORCH_BUILD = {"cuda": "cuda", "rocm": "hip", "xpu": "xpu"}
# the device nodes of a GPU driver (NVIDIA, AMD's KFD, a DRM render node): without any of them no
# Triton backend can find a device
GPU_DEVICE_NODES = ("dev/nvidia*", "dev/kfd", "dev/dri/renderD*")
NO_GPU = "no GPU device on this node"


def gpu_device_nodes(root: str | os.PathLike[str] = "/") -> list[str]:
    """The GPU device nodes under ``root`` (tests pass a folder of fakes)."""
    base = os.fspath(root)
    return sorted(p for pattern in GPU_DEVICE_NODES for p in glob.glob(os.path.join(base, pattern)))


def target_not_asked(device_nodes: Sequence[str], device_type: str) -> str | None:
    """Why Triton's runtime is not asked for a target (None: ask it): no GPU device node, and
    torch (``device_type``: the primary device's type) sees only the CPU."""
    if device_nodes or device_type != "cpu":
        return None
    patterns = ", ".join("/" + p for p in GPU_DEVICE_NODES)
    return f"{NO_GPU} (none of {patterns}, and torch sees only the CPU)"


def import_requests(located: Mapping[str, Located]) -> dict[str, ImportCheckRequest]:
    """The child imports worth running: installed libraries that are what they claim to be."""
    return {
        name: ImportCheckRequest(module=loc.library.check)
        for name, loc in located.items()
        if loc.installed and (loc.variant is None or loc.variant.usable)
    }


def library_entry(located: Located, imported: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON-ready entry for one library (keys documented in docs/env.md)."""
    lib, variant = located.library, located.variant
    if not located.installed:
        reason = "module not found"
        if located.distributions:
            reason = f"distribution {located.distribution} is installed but module {lib.module!r}"
            reason += " is not importable"
        status: dict[str, Any] = {"status": "not-installed", "reason": reason, "seconds": None}
    elif variant is not None and not variant.usable:
        status = {"status": "skipped", "reason": variant.label, "seconds": None}
    else:
        status = dict(NOT_RUN if imported is None else imported)
    return {
        "installed": located.installed,
        "version": located.distributions.get(located.distribution or "", None),
        "distribution": located.distribution,
        "distributions": dict(located.distributions),
        "module": lib.module,
        "location": located.location,
        "variant": variant.key if variant else None,
        "identified_as": variant.label if variant else None,
        "check_module": lib.check,
        "import": status,
    }


def triton_request(location: str | None, *, target: bool = True) -> ImportCheckRequest | None:
    """The import check of Triton at ``location`` (None: not installed); ``target``: also ask
    Triton's runtime for its target."""
    if location is None:
        return None
    return ImportCheckRequest(module=TRITON, probe="triton-target" if target else "")


def triton_entry(
    located: LocatedTriton,
    imported: Mapping[str, Any] | None,
    *,
    torch_build: str,
    device_arch: str,
    not_asked: str | None = None,
) -> dict[str, Any]:
    """The JSON-ready triton section (docs/env.md); ``not_asked``: ``target_not_asked``."""
    dists = located.distributions
    provider = located.owners[0] if len(located.owners) == 1 else None
    built_for = {n: located.backends.get(n) or [TRITON_DISTRIBUTIONS[n]] for n in dists}
    listed = ", ".join(f"{n} {dists[n]} (backends: {', '.join(b)})" for n, b in built_for.items())
    conflict = None
    if len(dists) > 1:
        conflict = f"several distributions install the same 'triton' package: {listed}; the one "
        conflict += f"installed last owns the files (now: {provider or 'unknown'})"
    wanted = BACKEND_FOR_TORCH_BUILD.get(torch_build)
    provider_backends = built_for.get(provider) if provider else None
    pin, matches_pin, pin_problem = located.torch_pin, None, None
    if pin is not None and provider is not None:
        matches_pin = provider == pin[0] and dists.get(provider, "") == pin[1]
        if not matches_pin:
            pin_problem = (
                f"torch was built with {pin[0]}=={pin[1]}, but the 'triton' package in use comes "
                f"from {provider} {dists.get(provider, '')}: Triton kernels (liger, "
                f"torch.compile) may fail to compile or behave differently; reinstall "
                f"{pin[0]}=={pin[1]} last"
            )
    status = {k: v for k, v in (imported or NOT_RUN).items() if k not in ("target", "target_error")}
    if not located.installed:
        status = {"status": "not-installed", "reason": "module not found", "seconds": None}
    # the active backend, arch and warp size: Triton's runtime's, else inferred from torch's build
    target = (imported or {}).get("target")
    found: dict[str, Any] = dict(backend=None, arch=None, warp_size=None, target_source=None)
    if target:
        backend = str(target.get("backend") or "")
        raw = str(target.get("arch") or "")
        raw = f"sm_{raw}" if backend == "cuda" and raw.isdigit() else raw
        raw = normalize_gcn_arch(raw) if backend == "hip" else raw
        found.update(backend=backend or None, arch=raw or None, warp_size=target.get("warp_size"))
        found["target_source"] = "runtime"
    elif located.installed and wanted is not None:
        found.update(backend=wanted, arch=device_arch or None, target_source="torch build")
    found["target_error"] = imported.get("target_error") if imported and not target else None
    return {
        "installed": located.installed,
        "location": located.location,
        "provider": provider,
        "provider_candidates": list(located.owners),
        "provider_evidence": located.owner_evidence or None,
        "version": dists.get(provider) if provider else None,
        "distributions": {n: {"version": v, "built_for": built_for[n]} for n, v in dists.items()},
        "conflict": conflict,
        "matches_torch_build": (
            None if wanted is None or provider_backends is None else wanted in provider_backends
        ),
        "torch_requires": f"{pin[0]}=={pin[1]}" if pin else None,
        "matches_torch_pin": matches_pin,
        "torch_pin_problem": pin_problem,
        **found,
        "target_not_asked": not_asked if imported is not None and not target else None,
        "import": status,
    }


def _torch_and_devices(
    torch: Any | None, nvml: NvmlList, errors: list[dict[str, str]]
) -> dict[str, Any]:
    """torch's build, its devices and the fingerprint; a failure is a fact in ``errors``."""

    def attempt(where: str, fact: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fact(*args, **kwargs)
        except Exception as exc:
            errors.append({"where": where, "error": failure(exc)})
            return None

    if torch is None:  # the one costly import of ``env``
        torch = attempt("import torch", importlib.import_module, "torch")
    torch_like = torch if torch is not None else _NO_TORCH
    out: dict[str, Any] = {"torch": None, "device": None, "accelerators": [], "fingerprint": None}
    if torch is not None:
        out["torch"] = attempt("torch build", accelerators.detect_torch_build, torch)
    try:
        primary = fingerprint.device_facts(torch_like)
    except DeviceVisibilityError:  # the user's variables contradict each other: not "a CPU node"
        raise
    except Exception as exc:  # the driver or torch failed while asking for the device
        errors.append({"where": "device", "error": failure(exc)})
        primary = fingerprint.device_facts(_NO_TORCH)
    out["device"] = dict(primary)
    devices = accelerators.detect_accelerators
    out["accelerators"] = attempt("accelerators", devices, torch_like, primary, nvml=nvml) or []
    if torch is not None:  # one device answer for both
        out["fingerprint"] = attempt(
            "fingerprint", fingerprint.current, torch, device=lambda _: primary
        )
    return out


def _checks_facts(
    run: bool, timeout: float, scaled: bool, imported: Mapping[str, Any], cache: ImportCache | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"run": run, "timeout": float(timeout)}
    if scaled:
        out["load_per_core"] = round(load_per_core(), 2)
    if run:
        notes = [cache.problem] if cache is not None and cache.problem else []
        out["notes"] = close_calls(imported, timeout) + notes
    if run and cache is not None:
        out["cache"] = {"folder": str(cache.folder), "read": cache.read, "reused": cache.used}
        out["cache"]["on"] = not cache.problem
    return out


def detect(
    *,
    import_checks: bool = True,
    timeout: float | None = None,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    torch: Any | None = None,
    table: Sequence[KnownLibrary] | None = None,
    nvml: NvmlList | None = None,
    cache: ImportCache | None = None,
    root: str = "/",
) -> dict[str, Any]:
    """Everything ``kernel-probe env`` reports, as JSON-ready data. ``import_checks``: import each
    installed library (and Triton) in a child, ``timeout`` seconds each (None: the default scaled
    to the load); ``extra_paths`` go first on the search path; ``env`` replaces os.environ for the
    children and site signals. ``table``, ``torch``, ``nvml``, ``root`` (of /dev): for tests."""
    start = time.perf_counter()
    errors: list[dict[str, str]] = []
    scaled = timeout is None and import_checks  # no child, no timeout to scale
    timeout = scaled_timeout() if scaled else float(DEFAULT_TIMEOUT if timeout is None else timeout)
    run = functools.partial(
        ImportChecks, timeout=timeout, extra_paths=extra_paths, env=env, cache=cache
    )
    # Only what decides which children to start, then the children: they import their libraries
    # while this process does the rest (and imports torch)
    located = libraries.locate_all(table, extra_paths)
    device_nodes = gpu_device_nodes(root)
    checks = None
    if import_checks:  # with no GPU device node, Triton's target is asked later if torch sees one
        requests = import_requests(located)
        where = libraries.module_location(TRITON, extra_paths)
        if (triton := triton_request(where, target=bool(device_nodes))) is not None:
            requests["triton"] = triton
        checks = run(requests)
    try:
        located_triton = libraries.locate_triton(extra_paths)
        host_facts = host.detect_host()
        here = _torch_and_devices(torch, nvml or lock_host.nvml_devices, errors)
        imported = checks.results() if checks is not None else {}
        not_asked = target_not_asked(device_nodes, here["device"]["type"])
        triton_ok = imported.get("triton", {}).get("status") == "ok"
        if not device_nodes and not_asked is None and triton_ok:
            # torch sees a device that left no device node: ask the runtime now, as on a GPU node
            checks = run({"triton": ImportCheckRequest(TRITON, probe="triton-target")})
            imported["triton"] = checks.results()["triton"]
    except BaseException:  # interrupted, or a bug here: no child is left running until its timeout
        if checks is not None:
            checks.cancel()
        raise
    libs = {name: library_entry(loc, imported.get(name)) for name, loc in located.items()}
    if here["torch"]:  # a fact about this torch and what is installed beside it
        here["torch"]["notes"] = torch_pin_notes(here["torch"]["version"])
    build, arch = here["torch"]["build"] if here["torch"] else "cpu", here["device"]["arch"]
    facts = dict(torch_build=build, device_arch=arch, not_asked=not_asked)
    triton_facts = triton_entry(located_triton, imported.get("triton"), **facts)
    return {
        "schema": SCHEMA,
        "kernel_probe": __version__,
        "seconds": round(time.perf_counter() - start, 3),
        "import_checks": _checks_facts(bool(import_checks), timeout, scaled, imported, cache),
        "host": host_facts,
        **{key: here[key] for key in ("torch", "device", "accelerators")},
        "triton": triton_facts,
        "libraries": libs,
        "site": host.detect_site(env),
        "fingerprint": here["fingerprint"],
        "errors": errors,
    }
