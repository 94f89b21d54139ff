"""The report of ``kernel-probe env``: every part of the detection layer, gathered as plain data.

    from kernel_probe.detect.report import detect
    report = detect()                      # dict; keys documented in docs/env.md
    report = detect(import_checks=False)   # no child processes: metadata and torch only

The primary device and the lock fingerprint come from ``kernel_lock.fingerprint`` (the code the
runtime uses), so the report and the lock can never disagree about what "this machine" is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from kernel_lock import fingerprint
from kernel_lock import host as lock_host
from kernel_lock.errors import DeviceVisibilityError
from kernel_probe.detect import accelerators, host, libraries, site, torchbuild
from kernel_probe.detect import triton as triton_info
from kernel_probe.detect.accelerators import NvmlList
from kernel_probe.detect.importcache import ImportCache
from kernel_probe.detect.importcheck import (
    DEFAULT_TIMEOUT,
    ImportChecks,
    ImportRequest,
    close_calls,
    load_per_core,
    scaled_timeout,
)
from kernel_probe.detect.libraries import KnownLibrary

SCHEMA = "kernel-probe-env/1"

TOP_LEVEL_KEYS = (
    "schema",
    "kernel_probe",
    "seconds",
    "import_checks",
    "host",
    "torch",
    "device",
    "accelerators",
    "triton",
    "libraries",
    "site",
    "fingerprint",
    "errors",
)

# What device_facts sees when torch cannot be imported: no GPU runtime, so it answers for the CPU.
_NO_TORCH = SimpleNamespace(version=SimpleNamespace(cuda=None, hip=None))


def _error(where: str, exc: BaseException) -> dict[str, str]:
    return {"where": where, "error": f"{type(exc).__name__}: {exc}"}


def _torch_and_devices(
    torch: Any | None, nvml: NvmlList, errors: list[dict[str, str]]
) -> dict[str, Any]:
    """torch's build, the primary device, every device, and the lock fingerprint; failures go to
    ``errors``."""
    if torch is None:
        try:
            import torch as torch_module

            torch = torch_module
        except Exception as exc:  # a broken torch is a fact to report, not the end of the report
            errors.append(_error("import torch", exc))
    torch_like = torch if torch is not None else _NO_TORCH
    torch_facts: dict[str, Any] | None = None
    if torch is not None:
        try:
            torch_facts = torchbuild.detect_torch_build(torch)
        except Exception as exc:
            errors.append(_error("torch build", exc))
    try:
        primary = fingerprint.device_facts(torch_like)
    except DeviceVisibilityError:  # the user's variables contradict each other: not "a CPU node"
        raise
    except Exception as exc:  # the driver or torch failed while asking for the device
        errors.append(_error("device", exc))
        primary = fingerprint.device_facts(_NO_TORCH)
    try:
        devices = accelerators.detect_accelerators(torch_like, primary, nvml=nvml)
    except Exception as exc:
        errors.append(_error("accelerators", exc))
        devices = []
    fp: dict[str, Any] | None = None
    if torch is not None:
        try:
            # one device answer for both
            fp = fingerprint.current(torch, device=lambda _torch: primary)
        except Exception as exc:
            errors.append(_error("fingerprint", exc))
    return {
        "torch": torch_facts,
        "device": dict(primary),
        "accelerators": devices,
        "fingerprint": fp,
    }


def _cache_notes(cache: ImportCache | None) -> list[str]:
    return [cache.problem] if cache is not None and cache.problem else []


def _cache_facts(cache: ImportCache) -> dict[str, Any]:
    return {
        "folder": str(cache.folder),
        "read": cache.read,
        "reused": cache.used,
        "on": not cache.problem,
    }


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
    child process with ``timeout`` seconds each (None: the default scaled to the machine's measured
    load, ``importcheck.scaled_timeout``), all at once; ``extra_paths`` go in front of the search
    path, in-process and on the children's PYTHONPATH; ``env`` replaces os.environ for the children
    and the site signals. ``table`` replaces ``libraries.known_libraries()``; ``torch`` and ``nvml``
    replace the real ones (tests). ``cache`` keeps and reuses the import checks' clean answers
    (``detect.importcache``; None: every library is asked). ``root`` is where ``/dev`` is, for the
    GPU device nodes that decide whether Triton's runtime is asked for a target (tests pass a
    folder).
    """
    from kernel_probe import __version__

    start = time.perf_counter()
    errors: list[dict[str, str]] = []
    scaled = timeout is None and import_checks  # no child, no timeout to scale
    timeout = scaled_timeout() if scaled else float(DEFAULT_TIMEOUT if timeout is None else timeout)

    # Only what decides which children to start, then the children, so they import their libraries
    # while this process does the rest (and imports torch): ImportChecks returns once each has
    # started.
    located_libs = libraries.locate_all(table, extra_paths)
    triton_location = libraries.module_location(triton_info.MODULE, extra_paths)
    device_nodes = triton_info.gpu_device_nodes(root)
    checks = None
    if import_checks:
        requests = libraries.import_requests(located_libs)
        # no GPU device node: Triton's runtime is asked for a target only if torch sees a device
        # after all
        triton_request = triton_info.import_request(triton_location, target=bool(device_nodes))
        if triton_request is not None:
            requests["triton"] = triton_request
        checks = ImportChecks(
            requests, timeout=timeout, extra_paths=extra_paths, env=env, cache=cache
        )

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
            # torch sees a device that left no device node: ask the runtime now, as on any GPU node
            late = {"triton": ImportRequest(triton_info.MODULE, probe="triton-target")}
            checks = ImportChecks(
                late, timeout=timeout, extra_paths=extra_paths, env=env, cache=cache
            )
            imported["triton"] = checks.results()["triton"]
    # interrupted, or a bug here: do not leave children running until their timeout
    except BaseException:
        if checks is not None:
            checks.cancel()
        raise
    libs = {name: libraries.report(loc, imported.get(name)) for name, loc in located_libs.items()}
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
        "import_checks": {
            "run": bool(import_checks),
            "timeout": float(timeout),
            **({"load_per_core": round(load_per_core(), 2)} if scaled else {}),
            **(
                {"notes": close_calls(imported, timeout) + _cache_notes(cache)}
                if import_checks
                else {}
            ),
            **({"cache": _cache_facts(cache)} if import_checks and cache is not None else {}),
        },
        "host": host_facts,
        "torch": here["torch"],
        "device": here["device"],
        "accelerators": here["accelerators"],
        "triton": triton_facts,
        "libraries": libs,
        "site": site.detect_site(env),
        "fingerprint": here["fingerprint"],
        "errors": errors,
    }
