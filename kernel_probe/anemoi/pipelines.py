"""The two anemoi pipelines, as library functions (no printing): check a config, and export a lock
for one.

``check_config``: every ``layer_kernels`` block of a config (composed as anemoi-training composes
it), judged on this machine (keys, imports, signatures, semantics) and, given a lock, against it.
``export_for_config``: the overlay that puts a lock's entries into a config so that, after Hydra's
merge, each block holds exactly what the lock says — anemoi's wrappers kept (``entry_for``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS, Exported, entry_for, export, gated_mlp_export
from kernel_lock.errors import LockError
from kernel_lock.lock import KernelLock
from kernel_probe.anemoi.block_checks import (
    compare_with_lock,
    components_without_blocks,
    lost_wrappers,
    merge_leftovers,
)
from kernel_probe.anemoi.blocks import Config, Finding
from kernel_probe.anemoi.entry_checks import DEFAULT_TIMEOUT, judge_entries
from kernel_probe.anemoi.reading import COMPOSE_MEMORY, read_config
from kernel_probe.anemoi.schema_check import SchemaRun, schema_findings, schema_run
from kernel_probe.anemoi.trust import NO_TRUST, Trust
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import (
    ConfigCheckReply,
    ConfigCheckRequest,
    EntryCheckReply,
    EntryCheckRequest,
    ProtocolError,
)

# the child that runs the schema and the entries of one reading (its module, never imported here)
CONFIG_CHILD = "kernel_probe.anemoi.config_child"

# check-config's exit codes (the global table's meanings, narrowed to this command)
CHECK_CONFIG_EXIT = {
    0: "no errors (warnings and notes may be printed)",
    3: "the config is valid here but disagrees with the lock (or the lock cannot be resolved here)",
    5: "the config has errors: unreadable or malformed, cannot be composed, unknown keys, "
    "targets that do not import, signatures that do not fit anemoi's calls, semantics changes, "
    "keys left over from a Hydra merge",
}

# where the overlay keeps the lock's entries; components point at them (an interpolation replaces a
# preset's entry whole, where a mapping would be merged into it key by key)
ENTRIES_NODE = "kernel_lock"


@dataclass
class CheckResult:
    """check-config's answer for one reading of a config: its blocks, the findings, what the lock
    exports."""

    config: Config
    findings: list[Finding]
    expected: dict[str, Exported] = field(default_factory=dict)  # what the lock exports, by key
    alternative: CheckResult | None = None  # the same file read as its other possible shape
    schema: str = "not run: --no-schema"  # how anemoi-training's schema was run, or why not

    @property
    def own_exit_code(self) -> int:
        """5 for any error but a lock disagreement, 3 for lock disagreements only, else 0 (this
        reading alone)."""
        errors = [f for f in self.findings if f.severity == "error"]
        if any(f.kind != "lock" for f in errors):
            return 5
        return 3 if errors else 0

    @property
    def exit_code(self) -> int:
        """The worse of the two readings where the file's shape is ambiguous (5 > 3 > 0)."""
        return max(self.own_exit_code, self.alternative.own_exit_code if self.alternative else 0)


def check_config(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    lock: KernelLock | None = None,
    mode: str | None = None,
    qk_norm: bool = False,
    allow_semantics_change: bool = False,
    compose: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    schema: bool = True,
    trust: Trust = NO_TRUST,
    _shape: str | None = None,
) -> CheckResult:
    """Judge the config at ``path`` on this machine, and against ``lock`` if given; ``schema``: also
    with anemoi-training's own schema, where it is installed. Only modules ``trust`` allows are
    imported."""
    options = {k: v for k, v in locals().items() if k not in ("path", "overrides", "_shape")}
    config = read_config(path, overrides, compose_overlays=compose, trust=trust, shape=_shape)
    findings: list[Finding] = list(config.findings)
    run: SchemaRun | str = schema_run(config) if schema else "not run: --no-schema"
    at_schema = len(findings)  # the schema's errors go here, once it has run with the entries
    findings.extend(lost_wrappers(config))
    from kernel_probe.anemoi.attention_checks import findings as attention_findings

    findings.extend(attention_findings(config.tree, lock, mode))
    from kernel_probe.anemoi.graph_attention_checks import findings as graph_attention_findings

    findings.extend(graph_attention_findings(config.tree, lock))
    from kernel_probe.anemoi.gated_checks import findings as gated_findings

    findings.extend(gated_findings(config.tree, lock))
    findings.extend(components_without_blocks(config, lock_given=lock is not None))
    expected: dict[str, Exported] = {}
    if lock is not None:
        try:
            expected = {
                e.key: e for e in export(lock, mode, qk_norm=qk_norm, verify_environment=False)
            }
        except LockError as exc:
            findings.append(
                Finding(
                    "error",
                    "lock",
                    lock.path or "<lock>",
                    f"the lock cannot be resolved here: {exc.problem}",
                    exc.fix or "",
                )
            )
    own = [b for b in config.blocks if b.content is not None]
    requests: list[EntryCheckRequest] = []
    # per request: its block, and whether its findings are reported
    asked: list[tuple[str, bool]] = []
    facts: dict[str, dict[str, Any]] = {b.where: {} for b in own}
    for b in own:
        content = b.content
        assert content is not None  # own holds the blocks with content
        for key, entry in content.items():
            target = entry.get("_target_") if isinstance(entry, dict) else None
            refusal = trust.refusal(target) if isinstance(target, str) and target else None
            kind = "trust"
            if (
                refusal is not None
                and refusal[0] == "warning"
                and not _installed_module(str(target))
            ):
                kind = "import"  # not installed: said without importing (or running) anything
                refusal = (
                    "error",
                    f"{target!r} does not import here: No module named "
                    f"{str(target).split('.')[0]!r} (looked up without importing anything)",
                    "install the library that provides it, or fix the dotted path",
                )
            # not imported: reported, and compared with the lock by name only
            if refusal is not None:
                findings.append(
                    Finding(refusal[0], kind, f"{b.where}.{key}", refusal[1], refusal[2])
                )
                facts[b.where][key] = {
                    "target": target,
                    "imported": False,
                    "family": None,
                    "defaults": {},
                }
                continue
            requests.append(
                EntryCheckRequest(
                    key=key,
                    entry=entry,
                    where=f"{b.where}.{key}",
                    allow_semantics_change=allow_semantics_change,
                )
            )
            asked.append((b.where, True))
        for key in expected:  # anemoi's default stands in for a key the block leaves out
            if key not in content:
                requests.append(
                    EntryCheckRequest(key=key, entry=ANEMOI_DEFAULTS[key], where=f"{b.where}.{key}")
                )
                asked.append((b.where, False))
    schema_status, schema_errors, results = _schema_and_entries(config, run, requests, timeout)
    findings[at_schema:at_schema] = schema_errors
    for req, (block, report), res in zip(requests, asked, results, strict=True):
        facts[block][req.key] = res.facts
        if report:
            findings.extend(Finding(**f) for f in res.findings)
    for b in own:
        findings.extend(merge_leftovers(b))
        if expected:
            findings.extend(compare_with_lock(b, expected, facts[b.where]))
    result = CheckResult(config, findings, expected, schema=schema_status)
    # ambiguous: check it the other way too, and report both
    if _shape is None and config.alternative:
        result.alternative = check_config(path, overrides, **options, _shape=config.alternative)
    return result


def _schema_and_entries(
    config: Config, run: SchemaRun | str, requests: list[EntryCheckRequest], timeout: float
) -> tuple[str, list[Finding], list[EntryCheckReply]]:
    """anemoi-training's schema on ``config`` (where ``run`` is one) and the entries' checks:
    (the schema's status line, its findings, one reply per request).

    Where both are asked, one child runs them (``kernel_probe.anemoi.config_child``: torch and
    anemoi-models imported once, not twice), both within ``timeout`` (together they take seconds).
    Where that child fails in any way (a crash, an error, over ``timeout``), each part runs again in
    a child of its own with its own ``timeout``, exactly as when it is asked alone, so the findings
    say which part failed and how; an entry whose import hangs costs one ``timeout`` more than it
    would alone."""
    reply: ConfigCheckReply | None = None
    if isinstance(run, SchemaRun) and requests:
        request = ConfigCheckRequest(
            schema=run.request, schema_memory=COMPOSE_MEMORY, entries=tuple(requests)
        )
        child = run_function(CONFIG_CHILD, "check", request, timeout=timeout)
        if child.ok:
            with contextlib.suppress(ProtocolError):  # not its answer: as if it had failed
                reply = ConfigCheckReply.from_json(child.value)
    if reply is not None and reply.schema is not None and len(reply.entries) == len(requests):
        status, errors = schema_findings(config, timeout, run=run, reply=reply.schema)
        return status, errors, list(reply.entries)
    # one part asked, or the one child failed: each part in a child of its own
    status, errors = schema_findings(config, timeout, run=run)
    return status, errors, judge_entries(requests, timeout=timeout)


def _installed_module(target: str) -> bool:
    """Whether ``target``'s top-level package is installed, found without importing (or running)
    anything."""
    from importlib.util import find_spec

    try:
        return find_spec(target.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


# ---- export for one config -----------------------------------------------------------------------
@dataclass
class ConfigExport:
    """The overlay for one config: ``entries`` (name -> lock entry) and, per block path, the keys
    set."""

    config: Config
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    # block path -> key -> entry name
    blocks: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (where, note)
    # GraphTransformer component path -> graph_attention_backend (the lock's [graph-attention])
    graph_attention: dict[str, str] = field(default_factory=dict)
    # component path (as in the config's tree) -> the keys the lock sets there (GatedMLP's
    # mlp_implementation)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    def overlay(self) -> dict[str, Any]:
        """The YAML-ready mapping to merge into the config (under ``model:`` unless it is a model
        file)."""
        model: dict[str, Any] = {ENTRIES_NODE: dict(self.entries)}
        for where, keys in self.blocks.items():
            node = model
            for part in where.split(".")[1:-1]:  # "model.processor.layer_kernels" -> processor
                node = node.setdefault(part, {})
            node["layer_kernels"] = {
                key: f"${{model.{ENTRIES_NODE}.{name}}}" for key, name in keys.items()
            }
        for where, backend in self.graph_attention.items():
            node = model
            for part in where.split("."):  # "encoders.0.mapper", relative to the model node
                node = node.setdefault(part, {})
            node["graph_attention_backend"] = backend
        for where, keys in self.components.items():
            node = model
            parts = where.split(".")
            # "model.processor" -> processor
            for part in parts[1:] if self.config.shape != "model-file" else parts:
                node = node.setdefault(part, {})
            node.update(keys)
        return model if self.config.shape == "model-file" else {"model": model}


def export_for_config(
    lock: KernelLock,
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    mode: str | None = None,
    qk_norm: bool = False,
    compose: bool = True,
    trust: Trust = NO_TRUST,
) -> ConfigExport:
    """The lock's entries for every block of the config at ``path`` (composed as training composes
    it).

    Raises what :func:`kernel_lock.anemoi.export` raises, and ``ConventionError`` where a block uses
    an anemoi wrapper the lock's kernel has no adapter for.
    """
    config = read_config(path, overrides, compose_overlays=compose, trust=trust)
    wanted = {e.key: e for e in export(lock, mode, qk_norm=qk_norm)}
    out = ConfigExport(config)
    for block in config.blocks:
        if block.content is None or block.where.startswith("("):
            continue  # inherits another block, which is handled there
        for key, want in wanted.items():
            where = f"{block.where}.{key}"
            current = block.content.get(key, ANEMOI_DEFAULTS[key])
            should = entry_for(key, want, current, where=where)
            if should is None:
                out.notes.append(
                    (
                        where,
                        f"{current['_target_']} is a different layer, not a kernel choice: "
                        "left as it is",
                    )
                )
                continue
            name = (
                key
                if should.entry == want.entry
                else f"{key}_{should.entry['_target_'].rpartition('.')[2]}"
            )
            out.entries.setdefault(name, should.entry)
            out.blocks.setdefault(block.where, {})[key] = name
            note = should.note if should.entry != want.entry else want.note
            if note:
                out.notes.append((where, note))
    from kernel_probe.anemoi.graph_attention_checks import export_setting, overlay_settings

    model_file = config.shape == "model-file"
    out.graph_attention = overlay_settings(config.tree, lock, model_file=model_file)
    setting = export_setting(lock)
    if setting is not None:
        prefix = "" if model_file else "model."
        out.notes.extend(
            (f"{prefix}{w}.graph_attention_backend", setting[1]) for w in out.graph_attention
        )
    gated = gated_mlp_export(lock)
    if gated is not None:
        from kernel_probe.anemoi.gated_checks import components

        for where, _ in components(config.tree):
            out.components[where] = dict(gated[0])
            out.notes.append((f"{where}.mlp_implementation", gated[1]))
    return out
