"""torch's build (version, CUDA / HIP / ROCm / XPU) read from its installed ``torch/version.py``,
parsed with ``ast`` and never executed, for ``torchless``."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fields import BUILD_FIELDS, DEVICE_FIELDS

__all__ = [
    "TorchBuild",
    "Unsettled",
    "metadata_agrees",
    "parse_version_file",
    "torch_build",
]


@dataclass(frozen=True)
class TorchBuild:
    """What ``torch.version`` would say, read from the installed file."""

    version: str  # torch.__version__ without the local part (+cu124)
    cuda: str
    hip: str
    rocm: str
    xpu: str
    path: str


class Unsettled(Exception):
    """A fact that cannot be read with certainty: the fields it decides, and why."""

    def __init__(self, fields: Iterable[str], why: str):
        super().__init__(why)
        self.fields = tuple(fields)
        self.why = why


# What a real torch/version.py holds: tools/generate_torch_version.py (and setup.py's older copy)
# writes ``from typing import Optional``, ``__all__ = [...]``, ``__version__ = '...'``, ``debug =
# False``, ``git_version = '...'`` and ``cuda`` / ``hip`` / ``rocm`` / ``xpu`` as ``NAME:
# Optional[str] = '...'`` (torch < 2.0: ``NAME = '...'``). Checked against the files of CPU, CUDA
# and ROCm wheels from 1.13 to 2.13 (tests/kernel_lock/fingerprint/test_version_file.py). Nothing
# else is read: anything else could change, when Python runs the file, what the names hold.
_VERSION_FILE_IMPORT = ("typing", ("Optional",))

_ANNOTATION = "Optional[str]"


def _plain_value(node: ast.expr) -> bool:
    """A literal as the generator writes one: a string, a bool, None, or a list of strings."""
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (str, bool))
    return isinstance(node, ast.List) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    )


def parse_version_file(text: str) -> dict[str, Any]:
    """The names a ``torch/version.py`` binds, read with ``ast`` (nothing is executed).

    Accepted, and nothing else: ``from typing import Optional`` (no alias), ``NAME = literal`` and
    ``NAME: Optional[str] = literal`` after that import (a literal: a string, a bool, None, a list
    of strings), each name bound once, never ``Optional``, ``str`` or a dunder other than
    ``__all__`` and ``__version__``. Anything else (another import, an alias, an annotation that is
    an expression with side effects, a name bound twice, a call) raises ``ValueError`` saying which
    line, rather than answer.
    """
    tree = ast.parse(text)
    values: dict[str, Any] = {}
    imported = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names if alias.asname is None)
            if (
                (node.module, names) == _VERSION_FILE_IMPORT
                and node.level == 0
                and len(node.names) == 1
            ):
                imported = True
                continue
            raise ValueError(
                f"line {node.lineno}: an import other than `from typing import Optional`"
            )
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            target, value = node.targets[0].id, node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.simple
            and node.value is not None
            and ast.unparse(node.annotation) == _ANNOTATION
            and isinstance(node.annotation, ast.Subscript)
            and isinstance(node.annotation.value, ast.Name)
            and imported
        ):
            target, value = node.target.id, node.value
        else:
            raise ValueError(
                f"line {node.lineno}: {type(node).__name__} statement (only `NAME = literal` and "
                f"`NAME: {_ANNOTATION} = literal` are read)"
            )
        if target in values:
            raise ValueError(f"line {node.lineno}: {target} is bound twice")
        if target in ("Optional", "str") or (
            target.startswith("__") and target not in ("__all__", "__version__")
        ):
            raise ValueError(f"line {node.lineno}: {target} is not a name torch's version.py binds")
        if not _plain_value(value):
            raise ValueError(
                f"line {node.lineno}: {target} is not a string, bool, None or list of strings"
            )
        values[target] = ast.literal_eval(value)
    return values


# The compiled parts ``import torch`` loads first: its extension module and, in a wheel's torch/lib,
# the libraries it links (Linux names; macOS .dylib, Windows .dll). A layout that keeps them
# elsewhere (a conda environment's lib/) is not judged from here: the fingerprint then imports
# torch.
_TORCH_LIBS = ("libc10", "libtorch_cpu", "libtorch_python")

_LIB_SUFFIX = {"linux": ".so", "darwin": ".dylib", "win32": ".dll"}


def _compiled_parts_missing(folder: Path, build: TorchBuild) -> str | None:
    """Why ``import torch`` may fail for a missing compiled part of torch in ``folder``; None when
    all are there."""
    import importlib.machinery

    if not any(
        (folder / f"_C{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    ):
        return f"torch's extension module {folder / '_C'}.* is missing: `import torch` would fail"
    suffix = _LIB_SUFFIX.get(sys.platform)
    if suffix is None:
        return f"torch's compiled libraries are not looked for on {sys.platform}"
    wanted = (
        list(_TORCH_LIBS)
        + (["libtorch_cuda"] if build.cuda else [])
        + (["libtorch_hip"] if build.hip else [])
    )
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
    """The version.py of the torch that ``import torch`` would load (find_spec runs none of its
    code)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError) as exc:
        raise Unsettled(BUILD_FIELDS + DEVICE_FIELDS, f"torch cannot be located: {exc}") from None
    if spec is None or not spec.submodule_search_locations:
        raise Unsettled(BUILD_FIELDS + DEVICE_FIELDS, "torch is not importable here")
    return Path(next(iter(spec.submodule_search_locations))) / "version.py"


def torch_build(path: Path | None = None) -> TorchBuild:
    """torch's version and CUDA / HIP / ROCm / XPU build from its installed ``version.py``; for the
    installed torch, only when its compiled parts are there too (else ``import torch`` fails)."""
    check_compiled = path is None
    path = _version_file() if path is None else path
    try:
        values = parse_version_file(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise Unsettled(
            BUILD_FIELDS + DEVICE_FIELDS, f"{path} cannot be read as plain data: {exc}"
        ) from None
    texts: dict[str, str] = {}
    for name in ("cuda", "hip", "rocm", "xpu"):
        value = values.get(name)
        if value is not None and not isinstance(value, str):
            raise Unsettled(
                BUILD_FIELDS + DEVICE_FIELDS, f"{path}: {name} = {value!r} is not a string"
            )
        texts[name] = value or ""
    version = values.get("__version__")
    version = version if isinstance(version, str) else ""  # the caller falls back for "torch"
    build = TorchBuild(
        version.split("+")[0], texts["cuda"], texts["hip"], texts["rocm"], texts["xpu"], str(path)
    )
    if check_compiled:
        missing = _compiled_parts_missing(path.parent, build)
        if missing:
            raise Unsettled(BUILD_FIELDS + DEVICE_FIELDS, missing)
    return build


def metadata_agrees(build: TorchBuild) -> str | None:
    """Why the installed distribution's version contradicts version.py (two torches on the
    path?)."""
    from importlib import metadata

    try:
        installed = metadata.version("torch").split("+")[0]
    except metadata.PackageNotFoundError:
        return None  # a source checkout on PYTHONPATH: version.py is what torch reports
    if build.version and installed != build.version:
        return f"the torch distribution says {installed} but {build.path} says {build.version}"
    return None
