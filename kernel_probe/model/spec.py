"""A model spec, read without torch: ``path/to/file.py:callable``, ``package.module:callable``, or
``anemoi:CONFIG`` (an anemoi training config: a YAML path or a config anemoi-training ships). The
callable takes no required arguments and returns ``(model, args)`` or ``(model, args, kwargs)``."""

from __future__ import annotations

import keyword
import os
from dataclasses import dataclass
from typing import Any

from kernel_probe.errors import UsageError

__all__ = ["ANEMOI", "ANEMOI_BUILDER", "ModelSpec", "parse_spec"]

ANEMOI = "anemoi"  # the prefix of an anemoi config's spec
ANEMOI_BUILDER = ("kernel_probe.anemoi.model", "build")  # its child-side builder: build(config)
_FORMS = "path/to/file.py:callable, package.module:callable or anemoi:CONFIG"


@dataclass(frozen=True)
class ModelSpec:
    """A parsed spec: ``kind`` file (``source`` an absolute path), module (a dotted module) or
    anemoi (``source`` the config: an absolute path, or a name anemoi-training ships)."""

    text: str
    kind: str
    source: str
    callable: str

    @property
    def folder(self) -> str | None:
        """A file's folder (on the child's path, so that its sibling imports work)."""
        return os.path.dirname(self.source) if self.kind == "file" else None

    def to_json(self) -> dict[str, Any]:
        """The child's request."""
        return {"text": self.text, "kind": self.kind, "source": self.source, "call": self.callable}


def _bad(spec: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"--model {spec!r}: {problem}", key="model", fix=fix)


def _dotted(name: str) -> bool:
    parts = name.split(".")
    return all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)


def _anemoi(text: str, config: str) -> ModelSpec:
    if not config:
        raise _bad(text, "no config after 'anemoi:'", "name a config: anemoi:path/to/config.yaml")
    is_path = config.endswith((".yaml", ".yml")) or os.sep in config or "/" in config
    if not is_path:
        return ModelSpec(text, ANEMOI, config, ANEMOI_BUILDER[1])
    path = os.path.abspath(os.path.expanduser(config))
    if not os.path.isfile(path):
        fix = "give the path of an existing YAML config, or the name of a config anemoi ships"
        raise _bad(text, f"config {config!r} is not a file", fix)
    return ModelSpec(text, ANEMOI, path, ANEMOI_BUILDER[1])


def parse_spec(text: str) -> ModelSpec:
    """The spec ``text`` as a :class:`ModelSpec`; :class:`UsageError` (exit 2) naming the fix."""
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty", f"name the model as {_FORMS}")
    text = text.strip()
    if text.startswith(ANEMOI + ":"):
        return _anemoi(text, text[len(ANEMOI) + 1 :])
    if ":" not in text:
        fix = f"name the callable that builds the model after a colon: {_FORMS}"
        raise _bad(text, "no ':callable'", fix)
    source, name = text.rsplit(":", 1)
    if not _dotted(name):
        fix = (
            "after the colon comes the name of a function (or Class.method) in that file or module"
        )
        raise _bad(text, f"{name!r} is not a Python name", fix)
    looks_like_path = source.endswith(".py") or "/" in source or os.sep in source
    if looks_like_path or os.path.isfile(source):
        path = os.path.abspath(os.path.expanduser(source))
        if not os.path.exists(path):
            raise _bad(text, f"{source!r} does not exist", "give the path of the model's .py file")
        if not os.path.isfile(path) or not path.endswith(".py"):
            fix = "name a .py file (path/to/file.py:callable) or a module (package.module:callable)"
            raise _bad(text, f"{source!r} is not a .py file", fix)
        return ModelSpec(text, "file", path, name)
    if not _dotted(source):
        fix = "a module is named by dots (package.module), a file by its path ending in .py"
        raise _bad(text, f"{source!r} is neither a .py file nor a module name", fix)
    return ModelSpec(text, "module", source, name)
