"""The fingerprint's facts: their catalogue (``FIELDS``), how strictly each must match, and the
comparison.

A lock's ``[environment]`` holds these fields (docs/lock-format.md); ``with_torch`` and
``torchless`` read them for this machine; :func:`compare` says where this machine differs from a
lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import Difference
from ..format.versions import release

if TYPE_CHECKING:
    from ..format.schema import Match

__all__ = [
    "BUILD_FIELDS",
    "DEVICE_FIELDS",
    "FIELDS",
    "GENERIC_DEVICE_NAMES",
    "NUMERICS_ENV",
    "FieldKind",
    "FieldSpec",
    "compare",
    "device_name_note",
    "field_matches",
    "library_versions",
    "numerics_env",
    "unchecked_fields",
]

FieldKind = Literal["version", "text", "count"]  # how a field's values compare


@dataclass(frozen=True)
class FieldSpec:
    """One fact of the fingerprint: its TOML type, default match rule, how it compares, and its doc
    line."""

    type: type | tuple[type, ...]
    default_match: Match
    kind: FieldKind  # "version" compares release numbers; "text" compares strings; "count" integers
    doc: str


FIELDS: dict[str, FieldSpec] = {
    "python": FieldSpec(
        str, "compatible", "version", "Python version (compatible: same major.minor)"
    ),
    "os": FieldSpec(str, "exact", "text", "operating system, lower case (linux, darwin, windows)"),
    "arch": FieldSpec(str, "exact", "text", "CPU architecture (x86_64, aarch64)"),
    "cpu-microarch": FieldSpec(
        str, "ignore", "text", "CPU microarchitecture from archspec (zen3, neoverse_v2)"
    ),
    "torch": FieldSpec(
        str, "compatible", "version", "torch version (compatible: same major.minor)"
    ),
    "torch-cuda": FieldSpec(
        str, "compatible", "version", "CUDA version torch was built with, '' if none"
    ),
    "torch-hip": FieldSpec(
        str, "compatible", "version", "HIP (ROCm) version torch was built with, '' if none"
    ),
    "torch-rocm": FieldSpec(
        str,
        "compatible",
        "version",
        "ROCm version torch was built with (torch.version.rocm, torch >= 2.10), '' if none",
    ),
    "device-type": FieldSpec(str, "exact", "text", "cpu, cuda, rocm, mps or xpu"),
    "device-vendor": FieldSpec(
        str, "exact", "text", "nvidia, amd, apple, intel, or the CPU vendor"
    ),
    "device-name": FieldSpec(str, "exact", "text", "device name as the driver reports it"),
    "device-arch": FieldSpec(str, "exact", "text", "sm_90, gfx90a, ...; '' on CPU"),
    "device-features": FieldSpec(
        str,
        "exact",
        "text",
        "ROCm target features from gcnArchName (sramecc+:xnack-); '' elsewhere: an xnack+ run "
        "is not an xnack- one",
    ),
    "device-count": FieldSpec(int, "ignore", "count", "number of devices of that type"),
    "driver": FieldSpec(
        str, "compatible", "version", "GPU driver version, '' when it cannot be read cheaply"
    ),
    "numerics-env": FieldSpec(
        str,
        "exact",
        "text",
        "environment variables that change what kernels compute, as "
        "VAR=value;... ('' when none is set; see NUMERICS_ENV)",
    ),
}

# the fields the device facts decide, and those torch's build decides (read together by torchless)
DEVICE_FIELDS = (
    "device-type",
    "device-vendor",
    "device-name",
    "device-arch",
    "device-features",
    "device-count",
    "driver",
)
BUILD_FIELDS = ("torch", "torch-cuda", "torch-hip", "torch-rocm")


# Environment variables that change the numbers kernels produce or which kernels run (recorded in
# the fingerprint as numerics-env, exact): on ROCm, rocBLAS's and MIOpen's alternate fp16 paths
# (PyTorch's numerical-accuracy notes: reduced-precision fp16 on MI200), XNACK (unified-memory
# retries; another code object), TunableOp's GEMM selection and the hipBLASLt preference.
NUMERICS_ENV = (
    "ROCBLAS_INTERNAL_FP16_ALT_IMPL",
    "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL",
    "HSA_XNACK",
    "PYTORCH_TUNABLEOP_ENABLED",
    "TORCH_BLAS_PREFER_HIPBLASLT",
)

# device names that say nothing about the device (libdrm's amdgpu.ids missing or old)
GENERIC_DEVICE_NAMES = ("AMD Radeon Graphics",)


def numerics_env(env: Mapping[str, str] | None = None) -> str:
    """``NUMERICS_ENV`` as set in ``env`` (default: this process): ``VAR=value;...``, '' when none
    is."""
    env = os.environ if env is None else env
    return ";".join(f"{name}={env[name]}" for name in NUMERICS_ENV if name in env)


def device_name_note(current: Mapping[str, Any]) -> str | None:
    """A note when the device name identifies nothing (empty or generic): the arch does."""
    name = str(current.get("device-name", ""))
    if current.get("device-type") not in ("cuda", "rocm"):
        return None
    if not name or name in GENERIC_DEVICE_NAMES:
        return (
            f"the device name is {name!r}, which does not identify the device (libdrm's "
            "amdgpu.ids is missing or old in this environment); it is identified by its arch "
            f"{current.get('device-arch')!r}"
        )
    return None


def field_matches(kind: FieldKind, rule: Match, expected: Any, found: Any) -> bool:
    """Does ``found`` satisfy ``expected`` under ``rule``?

    ``compatible`` on a version means the same major.minor (a patch or driver bump keeps the lock
    valid; a torch minor or CUDA minor does not). On text and counts it means equal.

    >>> field_matches("version", "compatible", "2.5.1", "2.5.3")  # a patch bump keeps the lock
    True
    >>> field_matches("version", "compatible", "12.4", "12.6")  # a minor does not
    False
    >>> field_matches("version", "compatible", "2.5.1+cu124", "2.5.0")  # a local label: no release
    True
    >>> field_matches("version", "exact", "2.5.1", "2.5.3")
    False
    >>> field_matches("version", "compatible", "2.5.1", "")  # not found: no match
    False
    >>> field_matches("count", "compatible", 8, 4), field_matches("count", "ignore", 8, 4)
    (False, True)
    """
    if rule == "ignore":
        return True
    if rule == "exact" or kind != "version":
        return expected == found
    if expected == "" or found == "":
        return expected == found
    e, f = release(str(expected)), release(str(found))
    if not e or not f:
        return expected == found
    return e[:2] == f[:2]


def compare(
    expected: Mapping[str, Any],
    found: Mapping[str, Any],
    libraries_expected: Mapping[str, Any],
    libraries_found: Mapping[str, str | None],
) -> list[Difference]:
    """Every field where ``found`` does not satisfy the lock's ``expected`` (EnvField objects)."""
    diffs = []
    for name, spec in expected.items():
        if name not in FIELDS:
            # written by a newer kernel-probe: reported by the loader, not checked (see
            # unchecked_fields)
            continue
        kind = FIELDS[name].kind
        value = found.get(name)
        if not field_matches(kind, spec.match, spec.value, value):
            diffs.append(Difference(name, spec.value, value, spec.match))
    for name, spec in libraries_expected.items():
        value = libraries_found.get(name)
        if value is None:
            if spec.match != "ignore":
                diffs.append(
                    Difference(f"libraries.{name}", spec.value, "not installed", spec.match)
                )
        elif not field_matches("version", spec.match, spec.value, value):
            diffs.append(Difference(f"libraries.{name}", spec.value, value, spec.match))
    return diffs


def unchecked_fields(expected: Mapping[str, Any]) -> list[str]:
    """The lock's environment fields this kernel_lock does not know, and so does not check."""
    return [name for name in expected if name not in FIELDS]


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed distribution versions from package metadata (nothing is imported)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
