"""The environment fingerprint: the facts a lock pins (``FIELDS``), their match rules, the
comparison, this machine's facts from torch, and torch's build parsed from its ``version.py``."""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import host
from .errors import Difference, KernelUnavailable

__all__ = [
    "BUILD_FIELDS",
    "DEVICE_FIELDS",
    "FIELDS",
    "Match",
    "GENERIC_DEVICE_NAMES",
    "NUMERICS_ENV",
    "Unsettled",
    "compare",
    "current",
    "device_facts",
    "device_name_note",
    "field_matches",
    "import_torch",
    "in_spec",
    "library_versions",
    "numerics_env",
    "parse_version_file",
    "release",
    "release_text",
    "torch_build",
    "unchecked_fields",
]

Match = Literal["exact", "compatible", "ignore"]  # how strictly a fingerprint field must match
FieldKind = Literal["version", "text", "count"]  # how a field's values compare


@dataclass(frozen=True)
class FieldSpec:
    """One fact of the fingerprint: its TOML type, default match rule, kind and doc line."""

    type: type | tuple[type, ...]
    default_match: Match
    kind: FieldKind  # "version" compares release numbers; "text" compares strings; "count" integers
    doc: str


_V: tuple[Match, FieldKind] = ("compatible", "version")
_X: tuple[Match, FieldKind] = ("exact", "text")
_IGNORED: tuple[Match, FieldKind] = ("ignore", "text")
_COUNT: tuple[Match, FieldKind] = ("ignore", "count")
_BUILT = "version torch was built with"
_ARCHSPEC = "archspec (zen3, neoverse_v2)"
_FEATURES = (
    "ROCm target features from gcnArchName (sramecc+:xnack-); '' elsewhere: an xnack+ run is not "
    "an xnack- one"
)
_NUMERICS = (
    "environment variables that change what kernels compute, as VAR=value;... ('' when none is "
    "set; see NUMERICS_ENV)"
)
FIELDS: dict[str, FieldSpec] = {
    name: FieldSpec(typ, *rule, doc)
    for name, typ, rule, doc in (
        ("python", str, _V, "Python version (compatible: same major.minor)"),
        ("os", str, _X, "operating system, lower case (linux, darwin, windows)"),
        ("arch", str, _X, "CPU architecture (x86_64, aarch64)"),
        ("cpu-microarch", str, _IGNORED, f"CPU microarchitecture from {_ARCHSPEC}"),
        ("torch", str, _V, "torch version (compatible: same major.minor)"),
        ("torch-cuda", str, _V, f"CUDA {_BUILT}, '' if none"),
        ("torch-hip", str, _V, f"HIP (ROCm) {_BUILT}, '' if none"),
        ("torch-rocm", str, _V, f"ROCm {_BUILT} (torch.version.rocm, torch >= 2.10), '' if none"),
        ("device-type", str, _X, "cpu, cuda, rocm, mps or xpu"),
        ("device-vendor", str, _X, "nvidia, amd, apple, intel, or the CPU vendor"),
        ("device-name", str, _X, "device name as the driver reports it"),
        ("device-arch", str, _X, "sm_90, gfx90a, ...; '' on CPU"),
        ("device-features", str, _X, _FEATURES),
        ("device-count", int, _COUNT, "number of devices of that type"),
        ("driver", str, _V, "GPU driver version, '' when it cannot be read cheaply"),
        ("numerics-env", str, _X, _NUMERICS),
    )
}

# the fields the device facts decide (DEVICE_KEYS: their keys in device_facts's dict), torch's build
DEVICE_FIELDS = (*(name for name in FIELDS if name.startswith("device-")), "driver")
DEVICE_KEYS = ("type", "vendor", "name", "arch", "features", "count", "driver")
BUILD_FIELDS = ("torch", "torch-cuda", "torch-hip", "torch-rocm")

# Variables that change what kernels compute or which run (ROCm's alternate fp16 paths, XNACK,
# TunableOp, the hipBLASLt preference).
NUMERICS_ENV = (
    "ROCBLAS_INTERNAL_FP16_ALT_IMPL",
    "MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL",
    "HSA_XNACK",
    "PYTORCH_TUNABLEOP_ENABLED",
    "TORCH_BLAS_PREFER_HIPBLASLT",
)
# device names that say nothing about the device (libdrm's amdgpu.ids missing or old)
GENERIC_DEVICE_NAMES = ("AMD Radeon Graphics",)

# The leading dotted numbers are the release, whatever follows is ignored (ROCm wheels' hip
# version carries a git hash PEP 440 cannot parse: ``6.2.41134-65d174c3e``).
_LEADING = re.compile(r"\s*v?([0-9]+(?:\.[0-9]+)*)", re.ASCII)


def release(text: str) -> tuple[int, ...]:
    """``'6.2.41134-65d174c3e'`` -> ``(6, 2, 41134)``; ``()`` if there is no release."""
    m = _LEADING.match(str(text))
    return tuple(int(part) for part in m.group(1).split(".")[:8]) if m else ()


def release_text(text: str) -> str:
    """``'6.2.41134-65d174c3e'`` -> ``'6.2.41134'``; ``''`` when there is no release."""
    return ".".join(str(n) for n in release(text))


def in_spec(spec: str, text: str) -> bool:
    """Does ``text`` satisfy the PEP 440 ``spec``? Pre-releases count; an unparsable version
    compares by its release (none: never)."""
    from packaging.specifiers import SpecifierSet  # only where a requirement is checked
    from packaging.version import InvalidVersion, Version

    if not text:
        return False
    try:
        version = Version(text)
    except InvalidVersion:
        numbers = release_text(text)
        if not numbers:
            return False
        version = Version(numbers)
    return SpecifierSet(spec).contains(version, prereleases=True)


def numerics_env(env: Mapping[str, str] | None = None) -> str:
    """``NUMERICS_ENV`` as set in ``env`` (default: os.environ): ``VAR=value;...`` or ''."""
    env = os.environ if env is None else env
    return ";".join(f"{name}={env[name]}" for name in NUMERICS_ENV if name in env)


def device_name_note(current: Mapping[str, Any]) -> str | None:
    """A note when the device name identifies nothing (empty or generic): the arch does."""
    name = str(current.get("device-name", ""))
    if current.get("device-type") not in ("cuda", "rocm") or (
        name and name not in GENERIC_DEVICE_NAMES
    ):
        return None
    return (
        f"the device name is {name!r}, which does not identify the device (libdrm's "
        "amdgpu.ids is missing or old in this environment); it is identified by its arch "
        f"{current.get('device-arch')!r}"
    )


def field_matches(kind: FieldKind, rule: Match, expected: Any, found: Any) -> bool:
    """Does ``found`` satisfy ``expected`` under ``rule``? ``compatible`` on a version:
    same major.minor; on text and counts: equal.

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
    (False, True)"""
    if rule == "ignore":
        return True
    if rule == "exact" or kind != "version" or expected == "" or found == "":
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
        # a field of a newer kernel-probe: reported by the loader, not checked (unchecked_fields)
        value = found.get(name)
        if name in FIELDS and not field_matches(FIELDS[name].kind, spec.match, spec.value, value):
            diffs.append(Difference(name, spec.value, value, spec.match))
    for name, spec in libraries_expected.items():
        value = libraries_found.get(name)
        if value is None and spec.match != "ignore":
            diffs.append(Difference(f"libraries.{name}", spec.value, "not installed", spec.match))
        elif value is not None and not field_matches("version", spec.match, spec.value, value):
            diffs.append(Difference(f"libraries.{name}", spec.value, value, spec.match))
    return diffs


def unchecked_fields(expected: Mapping[str, Any]) -> list[str]:
    """The lock's environment fields this kernel_lock does not know, and so does not check."""
    return [name for name in expected if name not in FIELDS]


def library_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed distribution versions from package metadata (nothing is imported)."""
    from importlib import metadata  # costs milliseconds: only where versions are asked

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def fields_of(
    build: Iterable[str] | None, device: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """The fingerprint's fields from torch's build, the device facts and the environment."""
    fields = host.fields() | dict(zip(BUILD_FIELDS, build or (), strict=build is not None))
    fields |= {n: device[k] for n, k in zip(DEVICE_FIELDS, DEVICE_KEYS, strict=True) if k in device}
    return fields | {"numerics-env": numerics_env(env)}


def _facts(kind: str, vendor: str, name: str, arch: str, count: int, driver: str) -> dict:
    return dict(type=kind, vendor=vendor, name=name, arch=arch, count=count, driver=driver)


def _gpus(cuda: Any) -> int:
    return int(cuda.device_count()) if cuda.is_available() and cuda.device_count() > 0 else 0


def device_facts(torch: Any) -> dict[str, Any]:
    """Type, vendor, name, arch, count and driver of the primary accelerator (or CPU).
    ROCm is told by ``torch.version.hip``, never by capability (an MI250X reports (9, 0))."""
    cuda: Any = getattr(torch, "cuda", None)
    if getattr(torch.version, "hip", None):
        host.physical_devices("rocm")  # contradictory visibility variables: an error, not "no GPU"
        count = _gpus(cuda) if cuda is not None else 0
        if count:
            props = cuda.get_device_properties(0)
            gcn = str(getattr(props, "gcnArchName", ""))
            arch, driver = host.normalize_gcn_arch(gcn), host.driver_version("rocm")
            facts = _facts("rocm", "amd", str(props.name), arch, count, driver)
            return {**facts, "features": host.gcn_features(gcn)}
    elif getattr(torch.version, "cuda", None) and cuda is not None:
        first = host.nvml_primary()
        if first is not None:
            return {"type": "cuda", "vendor": "nvidia", **first}
        count = _gpus(cuda)
        if count:
            major, minor = cuda.get_device_capability(0)
            name, driver = str(cuda.get_device_name(0)), host.driver_version("cuda")
            return _facts("cuda", "nvidia", name, f"sm_{major}{minor}", count, driver)
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        return _facts("mps", "apple", "Apple MPS", "", 1, "")
    xpu: Any = getattr(torch, "xpu", None)
    if getattr(xpu, "is_available", None) and xpu.is_available() and xpu.device_count() > 0:
        props = xpu.get_device_properties(0)
        name, driver = getattr(props, "name", "Intel XPU"), getattr(props, "driver_version", "")
        return _facts("xpu", "intel", str(name), "", int(xpu.device_count()), str(driver))
    return _facts("cpu", host.cpu_vendor(), host.cpu_name(), "", 1, "")


def import_torch() -> Any:
    """``import torch``, or :class:`KernelUnavailable` saying why it failed."""
    try:
        import torch
    except Exception as exc:  # ImportError, OSError from the dynamic loader, its __init__'s errors
        raise KernelUnavailable(
            f"`import torch` fails here: {type(exc).__name__}: {exc}",
            key="environment.torch",
            fix="repair or reinstall torch in this environment (pip install --force-reinstall "
            "torch)",
        ) from None
    return torch


def current(
    torch: Any | None = None, *, device: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """This machine's fingerprint fields, keyed like ``FIELDS`` (torch imported if not given)."""
    torch = import_torch() if torch is None else torch
    dev = {"features": "", "driver": "", **(device or device_facts)(torch)}
    build = [str(getattr(torch.version, name, None) or "") for name in ("cuda", "hip", "rocm")]
    version = str(torch.__version__).split("+")[0]
    return fields_of([version, *build], {**dev, "count": int(dev["count"])}, os.environ)


# ---- torch's build, from its installed version.py (for kernel_lock.torchless) --------------------
@dataclass(frozen=True)
class TorchBuild:
    """What ``torch.version`` would say, read from the installed file (``version``: no +cu124)."""

    version: str
    cuda: str
    hip: str
    rocm: str
    xpu: str
    path: str


class Unsettled(Exception):
    """A fact that cannot be read with certainty: the fields it decides, and why."""

    def __init__(self, fields: Iterable[str], why: str):
        super().__init__(why)
        self.fields, self.why = tuple(fields), why


_TORCH_FIELDS = BUILD_FIELDS + DEVICE_FIELDS  # what is unknown while torch's build is
# What torch's generate_torch_version.py writes (checked against wheels 1.13 to 2.13); nothing
# else is read: it could change what the names hold when run.
_ANNOTATION = "Optional[str]"


def _plain_value(node: ast.expr) -> bool:
    """A string, a bool, None, or a list of strings."""
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (str, bool))
    return isinstance(node, ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    )


def _binding(node: ast.stmt, imported: bool) -> tuple[str, ast.expr] | None:
    """(name, value) of ``NAME = value``, or of ``NAME: Optional[str] = value`` after the import."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return (target.id, node.value) if isinstance(target, ast.Name) else None
    if (
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.simple
        and node.value is not None
        and ast.unparse(node.annotation) == _ANNOTATION  # the structure, spelled exactly
        and imported
    ):
        return node.target.id, node.value
    return None


def parse_version_file(text: str) -> dict[str, Any]:
    """The names a ``torch/version.py`` binds, read with ``ast`` (nothing runs).

    Only ``from typing import Optional``, ``NAME = literal`` and ``NAME: Optional[str] = literal``
    (str, bool, None, list of str), each name once, no dunder but ``__all__``/``__version__``;
    anything else is a ``ValueError`` naming the line."""
    values: dict[str, Any] = {}
    imported = False
    for node in ast.parse(text).body:
        line = f"line {node.lineno}:"
        if isinstance(node, ast.ImportFrom):
            names = [(alias.name, alias.asname) for alias in node.names]
            if node.module == "typing" and names == [("Optional", None)] and node.level == 0:
                imported = True
                continue
            raise ValueError(f"{line} an import other than `from typing import Optional`")
        bound = _binding(node, imported)
        if bound is None:
            raise ValueError(
                f"{line} {type(node).__name__} statement (only `NAME = literal` and "
                f"`NAME: {_ANNOTATION} = literal` are read)"
            )
        target, value = bound
        if target in values:
            raise ValueError(f"{line} {target} is bound twice")
        if target in ("Optional", "str") or (
            target.startswith("__") and target not in ("__all__", "__version__")
        ):
            raise ValueError(f"{line} {target} is not a name torch's version.py binds")
        if not _plain_value(value):
            raise ValueError(f"{line} {target} is not a string, bool, None or list of strings")
        values[target] = ast.literal_eval(value)
    return values


# The compiled parts ``import torch`` loads first (a wheel's layout; elsewhere torch is imported)
_TORCH_LIBS = ("libc10", "libtorch_cpu", "libtorch_python")
_LIB_SUFFIX = {"linux": ".so", "darwin": ".dylib", "win32": ".dll"}


def _compiled_parts_missing(folder: Path, build: TorchBuild) -> str | None:
    """Why ``import torch`` may fail for a compiled part missing in ``folder``, or None."""
    import importlib.machinery

    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if not any((folder / f"_C{suffix}").is_file() for suffix in suffixes):
        return f"torch's extension module {folder / '_C'}.* is missing: `import torch` would fail"
    suffix = _LIB_SUFFIX.get(sys.platform)
    if suffix is None:
        return f"torch's compiled libraries are not looked for on {sys.platform}"
    extra = {"libtorch_cuda": build.cuda, "libtorch_hip": build.hip}
    wanted = [*_TORCH_LIBS, *(name for name, built in extra.items() if built)]
    if sys.platform == "win32":
        wanted = [name.removeprefix("lib") for name in wanted]
    missing = [name + suffix for name in wanted if not (folder / "lib" / (name + suffix)).is_file()]
    if missing:
        return (
            f"{folder / 'lib'} lacks {', '.join(missing)}: whether `import torch` succeeds "
            "is only known by importing it"
        )
    return None


def _version_file() -> Path:
    """The version.py of the torch ``import torch`` would load (find_spec runs none of its code)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        raise Unsettled(_TORCH_FIELDS, f"torch cannot be located: {exc}") from None
    if spec is None or not spec.submodule_search_locations:
        raise Unsettled(_TORCH_FIELDS, "torch is not importable here")
    return Path(next(iter(spec.submodule_search_locations))) / "version.py"


def torch_build(path: Path | None = None) -> TorchBuild:
    """torch's builds from ``version.py`` (installed torch: only with its compiled parts)."""
    check_compiled = path is None
    path = _version_file() if path is None else path
    try:
        values = parse_version_file(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise Unsettled(_TORCH_FIELDS, f"{path} cannot be read as plain data: {exc}") from None
    for name in ("cuda", "hip", "rocm", "xpu"):
        value = values.get(name)
        if value is not None and not isinstance(value, str):
            raise Unsettled(_TORCH_FIELDS, f"{path}: {name} = {value!r} is not a string")
    version = values.get("__version__")
    version = version if isinstance(version, str) else ""  # the caller falls back for "torch"
    texts = {name: values.get(name) or "" for name in ("cuda", "hip", "rocm", "xpu")}
    build = TorchBuild(version.split("+")[0], **texts, path=str(path))
    missing = _compiled_parts_missing(path.parent, build) if check_compiled else None
    if missing:
        raise Unsettled(_TORCH_FIELDS, missing)
    return build


def metadata_agrees(build: TorchBuild) -> str | None:
    """Why the installed torch's metadata contradicts version.py (two torches?), or None."""
    from importlib import metadata

    try:
        installed = metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        return None  # a source checkout on PYTHONPATH: version.py is what torch reports
    if build.version and installed != build.version:
        return f"the torch distribution says {installed} but {build.path} says {build.version}"
    return None
