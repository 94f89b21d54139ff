"""Reading an anemoi config as anemoi-training does (composed by Hydra in a child where that
decides the model), and what may be imported for it (:class:`Trust`, ``kernel_lock.trust``'s
rules)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from kernel_lock import registry
from kernel_lock.registry import generic_kernel
from kernel_lock.trust import granted_trust
from kernel_probe.anemoi.children import UNTRUSTED_SEARCH_PATH
from kernel_probe.anemoi.config import (
    INTERPOLATION,
    SHAPES,
    Config,
    Finding,
    add_block,
    add_blocks,
    classify,
    find_blocks,
    group_member,
    load_config,
    value_at,
)
from kernel_probe.errors import UsageError
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import ComposeReply, ComposeRequest, ProtocolError

COMPOSE_TIMEOUT = 60.0
COMPOSE_MEMORY = 4 << 30  # a child's budget beyond its imports (children._address_space)
CHILDREN = "kernel_probe.anemoi.children"  # the children's module, never imported by them
CONFIG_ROOTS = ("anemoi.models",)  # anemoi-models: AutocastLayerNorm is anemoi's own default
SEARCH_ROOTS = ("hydra.conf", "anemoi.training")  # pkg:// paths Hydra may import for composing
OWN_TARGETS_FLAG = "--import-config-targets"


@dataclass(frozen=True)
class Trust:
    """What may be imported for a config: ``modules`` (``--trust``, ``$KERNEL_LOCK_TRUST``) and,
    with ``own_targets`` (``--import-config-targets``), every public module its entries name."""

    modules: tuple[str, ...] = ()
    own_targets: bool = False

    @classmethod
    def granted(cls, trust: Sequence[str] = (), *, own_targets: bool = False) -> Trust:
        """The caller's trust: ``trust`` plus ``$KERNEL_LOCK_TRUST``, and ``own_targets``."""
        return cls(granted_trust(trust), own_targets)

    def refusal(self, target: str) -> tuple[str, str, str] | None:
        """None if ``target`` (and what a generic adapter wraps) may be imported, else why not."""
        inner = generic_kernel(target)
        names = [target] if inner is None else [target, inner]
        for name in names:
            if any(part.startswith("_") for part in name.split(".")):
                return (
                    "error",
                    f"{name!r} has a private or __main__ component: it is never imported "
                    "(importing a module's __main__ runs it), and anemoi would import it when it "
                    "builds the model",
                    "name a public class, e.g. torch.nn.LayerNorm",
                )
        if self.own_targets:
            return None
        roots = (*registry.allowed_roots(), *CONFIG_ROOTS, *self.modules)
        for name in names:
            if not any(name == r or name.startswith(r + ".") for r in roots):
                top = name.split(".")[0]
                return (
                    "warning",
                    f"not checked: module not trusted ({name!r} is outside the import allow-list "
                    "and the modules you trust; nothing was imported, so its import, signature "
                    "and semantics are unknown)",
                    f"if you trust it, `--trust {top}` (or $KERNEL_LOCK_TRUST={top}), or "
                    f"{OWN_TARGETS_FLAG} to let check-config import every module this config's "
                    "entries name",
                )
        return None

    def search_roots(self) -> tuple[str, ...]:
        """The packages Hydra may import for a ``pkg://`` search path while composing."""
        return (*SEARCH_ROOTS, *self.modules)


NO_TRUST = Trust()  # the allow-list alone


def add_config_trust_argument(p: argparse.ArgumentParser) -> None:
    """The ``--import-config-targets`` flag of the commands that read a config."""
    p.add_argument(
        OWN_TARGETS_FLAG,
        action="store_true",
        help="import every public module the config's own layer_kernels entries name (default: "
        "only the import allow-list, anemoi-models and --trust; an entry outside them is reported "
        "as not checked). A `__main__` or private module is never imported",
    )


def config_trust(args: argparse.Namespace) -> Trust:
    """The :class:`Trust` a command's ``--trust`` and ``--import-config-targets`` grant."""
    return Trust.granted(args.trust, own_targets=args.import_config_targets)


def installed(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def packaged_dir() -> Path | None:
    """anemoi-training's packaged config directory, found without importing it."""
    try:
        spec = find_spec("anemoi.training")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "config" / "config.yaml").is_file():
            return Path(location) / "config"
    return None


# ---- composition ---------------------------------------------------------------------------------
def compose(
    config_dir: Path,
    config_name: str,
    overrides: Sequence[str],
    timeout: float = COMPOSE_TIMEOUT,
    trust: Trust = NO_TRUST,
) -> tuple[ComposeReply | None, str, str]:
    """Hydra's composition of ``config_name`` from ``config_dir`` (and the search path anemoi adds),
    in a child: (answer, why not, exception type)."""
    if installed("hydra-core") is None:
        return None, "hydra-core is not installed here", "missing"
    request = ComposeRequest(
        config_dir=str(config_dir.resolve()),
        config_name=config_name,
        overrides=tuple(overrides),
        trusted=trust.search_roots(),
        memory=COMPOSE_MEMORY,
    )
    result = run_function(CHILDREN, "compose", request, timeout=timeout)
    if result.ok:
        try:
            return ComposeReply.from_json(result.value), "", ""
        except ProtocolError as exc:
            return None, str(exc), "protocol"
    kind = result.raised.get("raised", result.status) if result.raised else result.status
    return None, result.reason, kind


def _composed(config: Config, root: Mapping[str, Any], answer: ComposeReply) -> None:
    """Fill ``config`` from the child's composition (blocks resolved by OmegaConf itself)."""
    tree = answer.tree
    config.composed, config.tree = True, tree
    config.choices, config.sources = dict(answer.choices), list(answer.sources)
    written_model = root.get("model") if isinstance(root.get("model"), Mapping) else {}

    def add(where: str, value: Any) -> None:
        block = answer.blocks.get(where, {})
        if "error" in block:
            problem = f"Hydra cannot resolve this block: {block['error']}"
            config.findings.append(Finding("error", "interpolation", where, problem))
            return
        if "value" in block:
            add_block(config, where, block["value"])
            return
        content: dict[str, Any] = {}
        for key, entry in block.get("entries", {}).items():
            if isinstance(entry, Mapping) and "__error__" in entry:
                problem = f"Hydra cannot resolve this entry: {entry['__error__']}"
                config.findings.append(Finding("error", "interpolation", f"{where}.{key}", problem))
            else:
                content[key] = entry
        written = value_at(written_model, where.split(".")[1:])
        add_block(
            config, where, content, source=value if isinstance(value, str) else "", written=written
        )

    model = tree.get("model") if isinstance(tree, Mapping) else None
    none = "the composed config has no layer_kernels block: anemoi uses its defaults"
    add_blocks(config, model, add, none)


def _defaults_text(root: Mapping[str, Any]) -> str:
    items: list[str] = []
    for d in root.get("defaults") or []:
        if isinstance(d, Mapping):
            items.extend(f"{k}: {v}" for k, v in d.items())
        elif d != "_self_":
            items.append(str(d))
    return ", ".join(items) or "none"


def _not_composed(config: Config, root: Mapping[str, Any], why: str, fix: str) -> None:
    problem = (
        f"the defaults list ({_defaults_text(root)}) was not followed: {why}. Only what this file "
        "itself sets is checked; the presets' layer_kernels (anemoi's model for this run) are not "
        "seen here"
    )
    config.findings.append(Finding("warning", "defaults", "defaults", problem, fix))


_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")


def override_through_interpolation(why: str, root: Mapping[str, Any]) -> tuple[str, str] | None:
    """Where Hydra refused an override because a key on its path is an interpolation (the overlay
    ``export --config`` writes), the override that works (on the key it points at) and why."""
    m = _NOT_OVERRIDDEN.search(why)
    if m is None:
        return None
    parts = m.group(1).split(".")
    node: Any = root
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
        ref = INTERPOLATION.match(node) if isinstance(node, str) else None
        if ref is not None and i + 1 < len(parts):
            value = why.split("=", 1)[1].strip() if "=" in why else "VALUE"
            return (
                f"{'.'.join([ref.group(1), *parts[i + 1 :]])}={value}",
                f"{'.'.join(parts[: i + 1])} is the interpolation {node}, and Hydra cannot "
                "override a key under an interpolation",
            )
    return None


def _compose_failed(
    config: Config,
    root: Mapping[str, Any],
    as_root: Mapping[str, Any],
    p: Path,
    why: str,
    kind: str,
) -> None:
    """The finding for a composition that did not happen: a warning where it was switched off or
    Hydra or the presets are missing, an error where the config or a search path is refused."""
    if kind == "off":
        fix = "drop --no-compose to check the model anemoi-training will build"
        return _not_composed(config, root, why, fix)
    if kind == "missing":
        fix = (
            "install hydra-core and anemoi-training (`pip install --no-deps anemoi-training`, as "
            ".ci/anemoi-install does) to compose it as training does"
        )
        return _not_composed(config, root, why, fix)
    if kind == "MissingConfigException" and installed("anemoi-training") is None:
        why = f"anemoi-training is not installed here, so its presets cannot be found ({why})"
        fix = "install anemoi-training (`pip install --no-deps anemoi-training`) to compose it as "
        return _not_composed(config, root, why, fix + "training does")
    if kind == UNTRUSTED_SEARCH_PATH:
        problem = f"refused to compose: {why.partition(': ')[2] or why}"
        fix = "remove the search path; if it names a public package you trust, `--trust PACKAGE` "
        fix += "(or $KERNEL_LOCK_TRUST); a __main__ or private module is never imported"
    else:
        problem = f"Hydra cannot compose this config as anemoi-training would: {why}"
        fix = "fix the defaults list or the overrides; `anemoi-training train` would fail the "
        fix += "same way"
        if working := override_through_interpolation(why, as_root):
            problem += f" ({working[1]})"
            fix = f"override `{working[0]}` instead (it sets the entry every block pointing there "
            fix += "uses)"
    kind = "trust" if kind == UNTRUSTED_SEARCH_PATH else "compose"
    config.findings.insert(0, Finding("error", kind, str(p), problem, fix))


def read_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    compose_overlays: bool = True,
    timeout: float = COMPOSE_TIMEOUT,
    trust: Trust = NO_TRUST,
    shape: str | None = None,
) -> Config:
    """The blocks of the config at ``path``, composed as anemoi-training would where that decides
    the model (an overlay, a preset extending another, or ``overrides``) and Hydra can run here."""
    p = Path(path)
    root = load_config(p)
    decided = classify(root, p)
    shape = shape or decided.shape
    member = shape == "model-file" and group_member(root, p)
    if overrides and shape == "model-file" and not member:
        raise UsageError(
            f"{p}: overrides ({' '.join(overrides)}) apply to a primary config or to a preset in a "
            "config/model/ directory, not to a model file elsewhere",
            fix="pass the training config that selects this model (`- model: NAME`), or drop "
            "the overrides",
        )
    wants_composition = (
        shape == "overlay" or bool(overrides) or (member and isinstance(root.get("defaults"), list))
    )
    as_root = {"model": root} if shape == "model-file" else root
    answer, why, kind = None, "composition was switched off (--no-compose)", "off"
    if wants_composition and compose_overlays:
        if member:
            where, name, more = p.resolve().parent.parent, "config", [f"model={p.stem}"]
        else:
            where, name, more = p.parent, p.stem, []
        answer, why, kind = compose(where, name, [*more, *overrides], timeout, trust)
    if answer is not None:
        config = Config(shape=shape)
        _composed(config, as_root, answer)
    else:
        config = find_blocks(root, shape)
        if wants_composition:
            _compose_failed(config, root, as_root, p, why, kind)
    config.path, config.overrides = str(p), list(overrides)
    if shape == decided.shape:
        config.why, config.alternative = decided.why, decided.alternative
    else:
        config.why = (
            f"asked to read it as one (it looks like {SHAPES[decided.shape].split(' (')[0]}: "
            f"{decided.why})"
        )
    return config
