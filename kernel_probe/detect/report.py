"""The report of ``kernel-probe env``: every fact of the detection layer, as plain data
(``detect()``; keys documented in docs/env.md). The primary device and the lock fingerprint come
from ``kernel_lock.fingerprint``, so the report and the lock never disagree about this machine.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kernel_lock import fingerprint
from kernel_lock import host as lock_host
from kernel_lock.errors import DeviceVisibilityError
from kernel_probe import __version__
from kernel_probe.detect import accelerators, host, libraries
from kernel_probe.detect import triton as triton_info
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
from kernel_probe.detect.libraries import KnownLibrary

SCHEMA = "kernel-probe-env/1"
TOP_LEVEL_KEYS = (
    ("schema", "kernel_probe", "seconds", "import_checks", "host", "torch", "device")
    + ("accelerators", "triton", "libraries", "site")
    + ("fingerprint", "errors")
)
# What device_facts sees when torch cannot be imported: no GPU runtime, so it answers for the CPU.
_NO_TORCH = SimpleNamespace(version=SimpleNamespace(cuda=None, hip=None))


def _import_torch() -> Any:
    import torch  # the one costly import of ``env``

    return torch


def _torch_and_devices(
    torch: Any | None, nvml: NvmlList, errors: list[dict[str, str]]
) -> dict[str, Any]:
    """torch's build, the primary device, every device, the lock fingerprint; failures to
    ``errors`` (a broken torch or driver is a fact to report, not the end of the report)."""

    def attempt(where: str, fact: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fact(*args, **kwargs)
        except Exception as exc:
            errors.append({"where": where, "error": failure(exc)})
            return None

    torch = attempt("import torch", _import_torch) if torch is None else torch
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
    found = attempt(
        "accelerators", accelerators.detect_accelerators, torch_like, primary, nvml=nvml
    )
    out["accelerators"] = found or []
    if torch is not None:  # one device answer for both
        answer = attempt("fingerprint", fingerprint.current, torch, device=lambda _t: primary)
        out["fingerprint"] = answer
    return out


def _checks_facts(
    run: bool,
    timeout: float,
    scaled: bool,
    imported: Mapping[str, Mapping[str, Any]],
    cache: ImportCache | None,
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
    """Everything ``kernel-probe env`` reports, as JSON-ready data.

    ``import_checks`` imports each installed kernel library (and Triton, to read its target) in a
    child process, all at once, ``timeout`` seconds each (None: the default scaled to the machine's
    load); ``extra_paths`` go in front of the search path, in-process and on the children's
    PYTHONPATH; ``env`` replaces os.environ for the children and the site signals; ``cache`` keeps
    and reuses the checks' clean answers. ``table`` (the libraries), ``torch`` and ``nvml`` replace
    the real ones, and ``root`` is where ``/dev`` is (tests).
    """
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
    device_nodes = triton_info.gpu_device_nodes(root)
    checks = None
    if import_checks:  # with no GPU device node, Triton's target is asked later if torch sees one
        requests = libraries.import_requests(located)
        where = libraries.module_location(triton_info.MODULE, extra_paths)
        if (triton := triton_info.import_request(where, target=bool(device_nodes))) is not None:
            requests["triton"] = triton
        checks = run(requests)
    try:
        located_triton = triton_info.locate(extra_paths)
        host_facts = host.detect_host()
        here = _torch_and_devices(torch, nvml or lock_host.nvml_devices, errors)
        imported = checks.results() if checks is not None else {}
        not_asked = triton_info.target_not_asked(device_nodes, here["device"]["type"])
        if (
            not device_nodes
            and not_asked is None
            and imported.get("triton", {}).get("status") == "ok"
        ):
            # torch sees a device that left no device node: ask the runtime now, as on a GPU node
            checks = run({"triton": ImportCheckRequest(triton_info.MODULE, probe="triton-target")})
            imported["triton"] = checks.results()["triton"]
    except BaseException:  # interrupted, or a bug here: no child is left running until its timeout
        if checks is not None:
            checks.cancel()
        raise
    libs = {name: libraries.report(loc, imported.get(name)) for name, loc in located.items()}
    triton_facts = triton_info.report(
        located_triton,
        imported.get("triton"),
        torch_build=here["torch"]["build"] if here["torch"] else "cpu",
        device_arch=here["device"]["arch"],
        not_asked=not_asked,
    )
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
