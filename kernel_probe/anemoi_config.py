"""Reading an anemoi model config: where its ``layer_kernels`` blocks are, and what each one is.

anemoi-training defines the block once, at ``model.layer_kernels``, and each component refers to it
with ``${model.layer_kernels}``; a component may instead carry its own block (the ensemble processor
does). This module finds every block, follows simple ``${a.b.c}`` interpolations, and has each entry
judged by :func:`kernel_lock.anemoi.check_entry` in a child process (importing a target may crash or
hang; that must not take the checker with it). The lock comparison happens here, in the parent.
Parsing lives here; verdicts are kernel_lock.anemoi's; presentation is commands/anemoicmds.py's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS, KEYS, Finding

from .errors import InputFileError

# where anemoi components read a layer_kernels block, relative to the model node ("*": any key)
LOCATIONS: tuple[tuple[str, ...], ...] = (
    ("layer_kernels",),
    ("processor", "layer_kernels"),
    ("encoders", "*", "mapper", "layer_kernels"),
    ("decoders", "*", "mapper", "layer_kernels"),
    ("encoder", "layer_kernels"),  # layouts before multi-dataset encoders/decoders
    ("decoder", "layer_kernels"),
    ("noise_injector", "layer_kernels"),
)
COMPONENT_ROOTS = {loc[0] for loc in LOCATIONS}

_INTERPOLATION = re.compile(r"^\$\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}$")
MARK = "@@kernel-probe-anemoi-check@@"
DEFAULT_TIMEOUT = 120.0


def _loader():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # YAML 1.1 reads `1e-5` as a string; OmegaConf (and so anemoi) reads it as a float. Do the same.
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


def load_config(path: str | Path) -> Any:
    """The YAML document at ``path``; an unreadable or malformed file is an InputFileError (exit 5)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise InputFileError("is a directory, not a config file", path=str(p)) from None
    except OSError as exc:
        raise InputFileError(f"cannot read the config: {exc.strerror or exc}", path=str(p)) from None
    except UnicodeDecodeError as exc:
        raise InputFileError(f"not UTF-8 text: {exc.reason}", path=str(p)) from None
    try:
        data = yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputFileError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}", path=str(p)) from None
    if not isinstance(data, Mapping):
        raise InputFileError(f"expected a YAML mapping (an anemoi config), got {type(data).__name__}", path=str(p),
                             fix="pass the training config, or the model config (config/model/<name>.yaml)")  # fmt: skip
    return data


@dataclass
class Block:
    """One ``layer_kernels`` block as a component sees it."""

    where: str  # e.g. "model.processor.layer_kernels"
    content: Mapping[str, Any] | None = None  # interpolations resolved; None when it only inherits
    inherits: str | None = None  # e.g. "model.layer_kernels" for `${model.layer_kernels}`
    source: str = ""  # the interpolation it came through, if any


@dataclass
class Config:
    """The blocks of one config, and what was found while locating them."""

    blocks: list[Block] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    model_path: str = "model"


class _Resolver:
    def __init__(self, root: Mapping[str, Any]):
        self.root = root
        model = root.get("model")
        # a training config has `model:`; a model config file (config/model/x.yaml) *is* the model node
        self.model = model if isinstance(model, Mapping) else root
        self.model_is_root = self.model is root

    def lookup(self, dotted: str) -> Any:
        parts = dotted.split(".")
        node: Any = self.root
        if self.model_is_root and parts[0] == "model":
            node, parts = self.model, parts[1:]
        for part in parts:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise KeyError(dotted)
        return node

    def resolve(self, value: Any, where: str, problems: list[Finding], depth: int = 0) -> Any:
        """``value`` with every whole-string ``${a.b.c}`` replaced by what it points at."""
        if isinstance(value, str):
            m = _INTERPOLATION.match(value)
            if m is None:
                if "${" in value:
                    problems.append(Finding("warning", "interpolation", where,
                                            f"cannot follow {value!r} (only whole-value ${{a.b.c}} references are followed)"))  # fmt: skip
                return value
            if depth > 20:
                problems.append(Finding("error", "interpolation", where, f"{value!r}: interpolation loop"))
                return value
            try:
                target = self.lookup(m.group(1))
            except KeyError:
                problems.append(Finding("error", "interpolation", where, f"{value!r} points at nothing in this config"))
                return value
            return self.resolve(target, where, problems, depth + 1)
        if isinstance(value, Mapping):
            return {k: self.resolve(v, f"{where}.{k}", problems, depth) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]", problems, depth) for i, v in enumerate(value)]
        return value


def _expand(node: Any, location: tuple[str, ...], prefix: str) -> list[tuple[str, Any]]:
    """Every (dotted path, value) that ``location`` names under ``node``."""
    if not location:
        return [(prefix, node)]
    if not isinstance(node, Mapping):
        return []
    head, rest = location[0], location[1:]
    keys = [k for k in node if head == "*" or k == head]
    return [hit for k in keys for hit in _expand(node[k], rest, f"{prefix}.{k}")]


def find_blocks(root: Mapping[str, Any]) -> Config:
    """Every layer_kernels block of the config, inherited ones marked as such."""
    r = _Resolver(root)
    config = Config()
    raw: list[tuple[str, Any]] = []
    if not r.model_is_root and "layer_kernels" in root:
        raw.append(("layer_kernels", root["layer_kernels"]))
    for location in LOCATIONS:
        raw.extend(_expand(r.model, location, "model"))
    seen = {where for where, _ in raw}
    for where, value in raw:
        m = _INTERPOLATION.match(value) if isinstance(value, str) else None
        if m and m.group(1) in seen and m.group(1) != where:
            config.blocks.append(Block(where, inherits=m.group(1), source=value))
            continue
        content = r.resolve(value, where, config.findings)
        if content is None:
            config.findings.append(Finding("note", "entry", where, "empty: anemoi uses its defaults for every key"))
            content = {}
        if not isinstance(content, Mapping):
            config.findings.append(Finding("error", "entry", where, f"expected a mapping of {', '.join(KEYS)}, "
                                           f"got {type(content).__name__} {content!r:.60}"))  # fmt: skip
            continue
        config.blocks.append(Block(where, content=content, source=value if m else ""))
    if not raw:
        config.findings.append(Finding(
            "warning", "entry", "model", "no layer_kernels block found (looked at model.layer_kernels, "
            "model.processor, model.encoders.<k>.mapper, model.decoders.<k>.mapper, model.encoder, "
            "model.decoder, model.noise_injector): anemoi uses its defaults"))  # fmt: skip
        config.blocks.append(Block("(anemoi defaults)", content={}))
    return config


# ---- judging the entries, in a child process -------------------------------------------------------
CHILD_SOURCE = f"""
import json, sys
from kernel_lock.anemoi import check_entries
requests = json.load(sys.stdin)
result = check_entries(requests)
sys.stdout.flush()
sys.stdout.write("\\n{MARK}" + json.dumps(result, default=repr) + "\\n")
sys.stdout.flush()
"""


def _child(requests: list[dict[str, Any]], timeout: float) -> tuple[list[dict[str, Any]] | None, str]:
    from .detect.importcheck import child_environment

    try:
        proc = subprocess.run([sys.executable, "-c", CHILD_SOURCE], input=json.dumps(requests, default=str),
                              capture_output=True, text=True, timeout=timeout, env=child_environment())  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g} s (an import hangs?)"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):]), ""
    tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
    how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
    return None, f"the checking process {how}" + (f": {tail[-500:]}" if tail else "")


def judge_entries(requests: list[dict[str, Any]], timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, Any]]:
    """kernel_lock.anemoi.check_entries in a child; if that child dies, one child per entry says which."""
    if not requests:
        return []
    results, _ = _child(requests, timeout)
    if results is not None:
        return results
    out = []
    for r in requests:
        one, why_one = _child([r], timeout)
        if one is None:
            target = r["entry"].get("_target_") if isinstance(r["entry"], Mapping) else None
            one = [{"findings": [Finding("error", "import", r["where"], f"importing {target!r} failed: {why_one}",
                                         "run `kernel-probe env` to see which library is broken here").to_json()],
                    "facts": {"target": target, "imported": False, "family": None, "defaults": {}}}]  # fmt: skip
        out.extend(one)
    return out


# ---- the lock comparison ----------------------------------------------------------------------------
_MISSING = object()


def compare_with_lock(where: str, content: Mapping[str, Any], expected: Mapping[str, Mapping[str, Any]],
                      facts: Mapping[str, Mapping[str, Any]]) -> list[Finding]:  # fmt: skip
    """Where the block builds something other than what the lock pins (the keys the lock exports).

    ``facts[key]`` are the child's facts about the entry the block uses for that key (its own, or
    anemoi's default when the block does not set it).
    """
    out = []
    for key, want in expected.items():
        have = content.get(key, ANEMOI_DEFAULTS[key])
        if not isinstance(have, Mapping) or not isinstance(have.get("_target_"), str):
            continue  # already an error of the entry itself
        label = f"{where}.{key}" + ("" if key in content else " (not set: anemoi's default)")
        fact = facts.get(key, {})
        if have["_target_"] != want["_target_"]:
            if fact.get("family") == "conditional":
                out.append(Finding("note", "lock", label, f"{have['_target_']} is a conditional layer norm, a different "
                                   "layer rather than a kernel choice; the lock does not cover it"))  # fmt: skip
                continue
            out.append(Finding("error", "lock", label, f"builds {have['_target_']}, the lock pins {want['_target_']}",
                               "use the lock's entry (`kernel-probe export LOCK --format anemoi`), or re-probe"))  # fmt: skip
            continue
        defaults = fact.get("defaults", {})
        for name, value in want.items():
            if name == "_target_":
                continue
            got = have.get(name, defaults.get(name, _MISSING))
            if got is _MISSING or not _same(got, value):
                shown = "not set" if name not in have else repr(got)
                out.append(Finding("error", "lock", f"{label}.{name}",
                                   f"{name} is {shown}" + (f" (default {got!r})" if name not in have and got is not _MISSING else "")
                                   + f", the lock pins {value!r}", f"set `{name}: {json.dumps(value)}`"))  # fmt: skip
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b
