"""A described node: the facts ``profiles match PROFILE --node FILE`` judges a profile against.

A site engineer writes a profile on a login node, where no GPU is; a description of a GPU node lets
them test it there. A description is JSON, in one of two forms:

- what ``kernel-probe env --json`` prints on the node (schema ``kernel-probe-env/1``): its
  ``fingerprint``, ``libraries`` and ``site`` (hostname, Slurm variables, site markers) are read and
  everything else is ignored;
- the short form (schema ``kernel-probe-node/1``) with the same three keys, plus ``env``
  (environment variables a profile's ``[detect] env`` reads) and ``files`` (first lines of marker
  files), and ``description`` / ``sources`` saying where the facts come from. Unknown keys are
  errors.

Examples for the built-in sites ship as package data (``kernel_probe/profiles/sites/nodes/*.json``);
``--node NAME`` names one of them. Nothing here reads this machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.fingerprint import FIELDS
from kernel_lock.format.reading import (
    ReadError,
    context,
    get,
    get_int,
    get_literal,
    get_string_map,
    get_table,
    get_text,
    refuse_unknown,
)
from kernel_probe.candidates import DEVICE_TYPES
from kernel_probe.errors import InputFileError, UsageError

NODE_SCHEMA = "kernel-probe-node/1"
ENV_SCHEMA = "kernel-probe-env/1"
EXAMPLES_DIR = "nodes"  # under kernel_probe/profiles/sites/
MAX_BYTES = 4 << 20  # an env --json report is some tens of kB
_NODE_KEYS = (
    "schema",
    "description",
    "sources",
    "fingerprint",
    "libraries",
    "site",
    "env",
    "files",
)
_SITE_KEYS = ("hostname", "slurm", "markers")


class NodeError(InputFileError):
    """A malformed node description (exit 5), naming the file and the key."""


@dataclass(frozen=True)
class Node:
    """The facts of one node, as a profile sees them."""

    path: str
    description: str
    fingerprint: Mapping[str, Any]
    # report name or distribution -> {version, variant, distributions}
    libraries: Mapping[str, Mapping[str, Any]]
    hostname: str
    slurm: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


def examples_dir() -> Path:
    """The directory of the built-in node description examples."""
    from kernel_probe.profiles.discovery import builtin_dir

    return builtin_dir() / EXAMPLES_DIR


def examples() -> dict[str, Path]:
    """The shipped example descriptions by name (the name of the built-in profile each
    describes)."""
    return {p.stem: p for p in sorted(examples_dir().glob("*.json"))}


def load(spec: str) -> Node:
    """A description by path, or by the name of a shipped example (no '/', no '.json')."""
    if "/" not in spec and not spec.endswith(".json"):
        known = examples()
        if spec not in known:
            raise UsageError(
                f"--node {spec!r}: no such example node; examples: {', '.join(known) or 'none'}",
                fix="pass the path of a JSON description (e.g. `kernel-probe env --json > "
                "node.json` on the node)",
            )
        return load(str(known[spec]))
    from kernel_lock.files import UnsafeFile, read_regular

    try:
        text = read_regular(spec, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise NodeError(
            "no such file",
            path=spec,
            fix="write one with `kernel-probe env --json > node.json` on the node",
        ) from None
    except UnsafeFile as exc:
        raise NodeError(exc.problem, path=spec, fix=exc.fix or None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeError(f"cannot read: {exc}", path=spec) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NodeError(f"not valid JSON: {exc}", path=spec) from None
    return parse(data, spec)


_LIBRARY_KEYS = ("version", "variant", "distributions")
_ENV_LIBRARY_KEYS = (*_LIBRARY_KEYS, "installed")  # env --json: its other keys are not read


def parse(data: Any, path: str) -> Node:
    """The typed reader of a node description (``kernel_lock.format.reading``): a value of the wrong
    type, an unknown key of the short form, a variant no library has, is a :class:`NodeError` naming
    the key."""
    try:
        return _parse(data, path)
    except ReadError as exc:
        raise NodeError(exc.problem, path=path, key=exc.key or None, fix=exc.fix) from None


def _parse(data: Any, path: str) -> Node:
    if not isinstance(data, dict):
        raise ReadError(
            "expected a JSON object (a node description or `kernel-probe env --json`), got "
            f"{type(data).__name__}"
        )
    schema = data.get("schema")
    if schema not in (NODE_SCHEMA, ENV_SCHEMA):
        raise ReadError(
            f"unknown schema {schema!r:.80}",
            "schema",
            fix=f"use {NODE_SCHEMA!r} (docs/profiles.md), or the output of `kernel-probe env "
            "--json`",
        )
    strict = schema == NODE_SCHEMA
    if strict:
        refuse_unknown(data, _NODE_KEYS)
    fp = get(data, "fingerprint", dict)
    if fp is None:
        raise ReadError(
            "required: an object of the node's facts (as `kernel-probe env --json` has)",
            "fingerprint",
        )
    fingerprint: dict[str, Any] = {}
    with context("fingerprint"):
        if strict:
            refuse_unknown(fp, tuple(FIELDS))
        for name, spec in FIELDS.items():
            if spec.type is int:
                fingerprint[name] = get_int(fp, name, 0, 1 << 20, default=0)
            else:
                fingerprint[name] = get_text(fp, name, "", limit=400)
        fingerprint["device-type"] = get_literal(
            fp, "device-type", DEVICE_TYPES, default="", fold=True
        )
    libraries: dict[str, Mapping[str, Any]] = {}
    libs = get(data, "libraries", dict, default={})
    with context("libraries"):
        for name, value in libs.items():
            with context(str(name)):
                entry = _library(str(name), value, strict)
            if entry is not None:
                libraries[str(name)] = entry
    site = get_table(data, "site", _SITE_KEYS if strict else None)
    with context("site"):
        hostname = get_text(site, "hostname", "", limit=255) or ""
        slurm = get_string_map(site, "slurm")
        markers = get(site, "markers", list, default=[])
    env = get_string_map(data, "env")
    files = get_string_map(data, "files")
    for i, marker in enumerate(markers):  # env --json: the site markers it found
        with context(f"site.markers[{i}]"):
            if not isinstance(marker, dict):
                raise ReadError(f"expected an object (signal, value), got {type(marker).__name__}")
            kind, _, name = (get_text(marker, "signal", "", limit=400) or "").partition(":")
            value = marker.get("value")
        if kind in ("env", "file") and isinstance(value, str):
            (env if kind == "env" else files).setdefault(name, value)
    get(data, "sources", list, default=[])
    return Node(
        path=path,
        description=get_text(data, "description", "") or "",
        fingerprint=fingerprint,
        libraries=libraries,
        hostname=hostname,
        slurm=slurm,
        env=env,
        files=files,
    )


def _library(name: str, value: Any, strict: bool) -> Mapping[str, Any] | None:
    """One library of a node: {version, variant (as the registry spells it), distributions}; None
    when ``env --json`` lists it as not installed."""
    from kernel_probe.detect.libraries import known_libraries

    if isinstance(value, str):
        value = {"version": value}
    if not isinstance(value, dict):
        raise ReadError(
            f"expected a version string or {{version, variant}}, got {type(value).__name__}"
        )
    if strict:
        refuse_unknown(value, _LIBRARY_KEYS)
    version = get_text(value, "version", None, limit=200)
    distributions = (
        get_string_map(value, "distributions", limit=200) if value.get("distributions") else {}
    )
    installed = get(value, "installed", bool, default=True)
    variant = None
    if value.get("variant") is not None:
        lib = next((lib for lib in known_libraries() if lib.name == name), None)
        keys = [v.key for v in lib.variants] if lib is not None else []
        if not keys:
            raise ReadError(
                f"{name} has no variants kernel-probe tells apart", "variant", "remove the variant"
            )
        variant = get_literal(value, "variant", keys, fold=True)  # NVIDIA -> nvidia
    if installed is False or version is None and not distributions:
        return None  # env --json lists every known library, installed or not
    return {"version": version, "variant": variant, "distributions": distributions}


def site_facts(node: Node) -> Any:
    """The node's site facts, for auto-detection (kernel_probe.profiles.autodetect.SiteFacts)."""
    from kernel_probe.profiles.autodetect import SiteFacts

    device = {
        "type": node.fingerprint["device-type"],
        "vendor": node.fingerprint["device-vendor"],
        "arch": node.fingerprint["device-arch"],
    }
    return SiteFacts(
        env={**node.slurm, **node.env},
        hostname=node.hostname,
        slurm=node.slurm,
        device=device,
        read_file=node.files.get,
    )
