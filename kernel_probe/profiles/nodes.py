"""A described node: the facts ``profiles match PROFILE --node FILE`` judges a profile against.

A site engineer writes a profile on a login node, where no GPU is; a description of a GPU node lets
them test it there. A description is JSON, in one of two forms:

- what ``kernel-probe env --json`` prints on the node (schema ``kernel-probe-env/1``): its
  ``fingerprint``, ``libraries`` and ``site`` (hostname, Slurm variables, site markers) are read and
  everything else is ignored;
- the short form (schema ``kernel-probe-node/1``) with the same three keys, plus ``env`` (environment
  variables a profile's ``[detect] env`` reads) and ``files`` (first lines of marker files), and
  ``description`` / ``sources`` saying where the facts come from. Unknown keys are errors.

Examples for the built-in sites ship as package data (``kernel_probe/profiles/sites/nodes/*.json``);
``--node NAME`` names one of them. Nothing here reads this machine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.fingerprint.fields import FIELDS
from kernel_probe.errors import InputFileError, UsageError
from kernel_probe.probe.candidates import DEVICE_TYPES

NODE_SCHEMA = "kernel-probe-node/1"
ENV_SCHEMA = "kernel-probe-env/1"
EXAMPLES_DIR = "nodes"  # under kernel_probe/profiles/sites/
MAX_BYTES = 4 << 20  # an env --json report is some tens of kB
_NODE_KEYS = ("schema", "description", "sources", "fingerprint", "libraries", "site", "env", "files")
_SITE_KEYS = ("hostname", "slurm", "markers")


class NodeError(InputFileError):
    """A malformed node description (exit 5), naming the file and the key."""


@dataclass(frozen=True)
class Node:
    """The facts of one node, as a profile sees them."""

    path: str
    description: str
    fingerprint: Mapping[str, Any]
    libraries: Mapping[str, Mapping[str, Any]]  # report name or distribution -> {version, variant, distributions}
    hostname: str
    slurm: Mapping[str, str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)


def examples_dir() -> Path:
    from kernel_probe.profiles.discovery import builtin_dir

    return builtin_dir() / EXAMPLES_DIR


def examples() -> dict[str, Path]:
    """The shipped example descriptions by name (the name of the built-in profile each describes)."""
    return {p.stem: p for p in sorted(examples_dir().glob("*.json"))}


def load(spec: str) -> Node:
    """A description by path, or by the name of a shipped example (no '/', no '.json')."""
    if "/" not in spec and not spec.endswith(".json"):
        known = examples()
        if spec not in known:
            raise UsageError(
                f"--node {spec!r}: no such example node; examples: {', '.join(known) or 'none'}",
                fix="pass the path of a JSON description (e.g. `kernel-probe env --json > node.json` on the node)",
            )
        return load(str(known[spec]))
    from kernel_lock._files import UnsafeFile, read_regular

    try:
        text = read_regular(spec, MAX_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise NodeError(
            "no such file", path=spec, fix="write one with `kernel-probe env --json > node.json` on the node"
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


def _err(path: str, key: str, problem: str, fix: str | None = None) -> NodeError:
    return NodeError(problem, path=path, key=key, fix=fix)


def _strings(d: Any, key: str, path: str) -> dict[str, str]:
    if d is None:
        return {}
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in d.items()):
        raise _err(path, key, "expected an object of strings")
    return dict(d)


def parse(data: Any, path: str) -> Node:
    if not isinstance(data, dict):
        raise _err(path, "", "expected a JSON object (a node description or `kernel-probe env --json`)")
    schema = data.get("schema")
    if schema not in (NODE_SCHEMA, ENV_SCHEMA):
        raise _err(
            path,
            "schema",
            f"unknown schema {schema!r}",
            fix=f"use {NODE_SCHEMA!r} (docs/profiles.md), or the output of `kernel-probe env --json`",
        )
    strict = schema == NODE_SCHEMA
    if strict:
        for k in data:
            if k not in _NODE_KEYS:
                raise _err(path, k, f"unknown key {k!r}", fix=f"known keys: {', '.join(_NODE_KEYS)}")
    fp = data.get("fingerprint")
    if not isinstance(fp, dict):
        raise _err(path, "fingerprint", "required: an object of the node's facts (as `kernel-probe env --json` has)")
    fingerprint: dict[str, Any] = {}
    for name, spec in FIELDS.items():
        value = fp.get(name, 0 if spec.type is int else "")
        if isinstance(value, bool) or not isinstance(value, spec.type):
            raise _err(path, f"fingerprint.{name}", f"expected {'an integer' if spec.type is int else 'a string'}")
        fingerprint[name] = value
    if strict:
        for k in fp:
            if k not in FIELDS:
                raise _err(path, f"fingerprint.{k}", f"unknown fact {k!r}", fix=f"known: {', '.join(FIELDS)}")
    if fingerprint["device-type"] not in DEVICE_TYPES:
        raise _err(path, "fingerprint.device-type", f"expected one of {', '.join(DEVICE_TYPES)}")
    libraries: dict[str, Mapping[str, Any]] = {}
    libs = data.get("libraries") or {}
    if not isinstance(libs, dict):
        raise _err(path, "libraries", "expected an object: library -> version, or -> {version, variant}")
    for name, value in libs.items():
        if isinstance(value, str):
            value = {"version": value}
        if not isinstance(value, dict):
            raise _err(path, f"libraries.{name}", "expected a version string or {version, variant}")
        if strict and any(k not in ("version", "variant", "distributions") for k in value):
            raise _err(path, f"libraries.{name}", "known keys: version, variant, distributions")
        if value.get("installed") is False or value.get("version") is None and not value.get("distributions"):
            continue  # env --json lists every known library, installed or not
        libraries[name] = value
    site = data.get("site") or {}
    if not isinstance(site, dict):
        raise _err(path, "site", "expected an object: hostname, slurm")
    if strict:
        for k in site:
            if k not in _SITE_KEYS:
                raise _err(path, f"site.{k}", f"unknown key {k!r}", fix=f"known keys: {', '.join(_SITE_KEYS)}")
    hostname = site.get("hostname", "")
    if not isinstance(hostname, str):
        raise _err(path, "site.hostname", "expected a string")
    env = _strings(data.get("env"), "env", path)
    files = _strings(data.get("files"), "files", path)
    for marker in site.get("markers") or []:  # env --json: the site markers it found
        kind, _, name = str(marker.get("signal", "")).partition(":") if isinstance(marker, dict) else ("", "", "")
        if kind in ("env", "file") and isinstance(marker.get("value"), str):
            (env if kind == "env" else files).setdefault(name, marker["value"])
    description = data.get("description", "")
    return Node(
        path=path,
        description=description if isinstance(description, str) else "",
        fingerprint=fingerprint,
        libraries=libraries,
        hostname=hostname,
        slurm=_strings(site.get("slurm"), "site.slurm", path),
        env=env,
        files=files,
    )


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
