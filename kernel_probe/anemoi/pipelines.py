"""The two anemoi pipelines as library functions (no printing): :func:`check_config` and
:func:`export_for_config`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from kernel_lock.anemoi import ANEMOI_DEFAULTS, Exported, entry_for, export, gated_mlp_export
from kernel_lock.errors import LockError
from kernel_lock.lock import KernelLock
from kernel_probe.anemoi import checks, components
from kernel_probe.anemoi.checks import SchemaRun, schema_findings
from kernel_probe.anemoi.config import Config, Finding
from kernel_probe.anemoi.entries import DEFAULT_TIMEOUT, judge_entries, not_imported
from kernel_probe.anemoi.reading import CHILDREN, COMPOSE_MEMORY, NO_TRUST, Trust, read_config
from kernel_probe.anemoi.versions import torch_pin_notes
from kernel_probe.isolation.child import run_function
from kernel_probe.isolation.protocol import (
    ConfigCheckReply,
    ConfigCheckRequest,
    EntryCheckReply,
    EntryCheckRequest,
    ProtocolError,
)

# check-config's exit codes (the global table's meanings, narrowed to this command)
CHECK_CONFIG_EXIT = {
    0: "no errors (warnings and notes may be printed)",
    3: "the config is valid here but disagrees with the lock (or the lock cannot be resolved here)",
    5: "the config has errors: unreadable or malformed, cannot be composed, unknown keys, "
    "targets that do not import, signatures that do not fit anemoi's calls, semantics changes, "
    "keys left over from a Hydra merge",
}
# where the overlay keeps the lock's entries; blocks point at them (an interpolation replaces a
# preset's entry whole, where a mapping would be merged into it key by key)
ENTRIES_NODE = "kernel_lock"


@dataclass
class CheckResult:
    """check-config's answer for one reading of a config: its blocks, the findings, what the lock
    exports (by key), the same file read as its other possible shape, and how the schema ran."""

    config: Config
    findings: list[Finding]
    expected: dict[str, Exported] = field(default_factory=dict)
    alternative: CheckResult | None = None
    schema: str = "not run: --no-schema"
    torch_pin: list[str] = field(default_factory=list)  # anemoi's torch pin overridden: a note

    @property
    def own_exit_code(self) -> int:
        """5 for any error but a lock disagreement, 3 for lock disagreements only, else 0."""
        errors = [f for f in self.findings if f.severity == "error"]
        if any(f.kind != "lock" for f in errors):
            return 5
        return 3 if errors else 0

    @property
    def exit_code(self) -> int:
        """The worse of the two readings where the file's shape is ambiguous (5 > 3 > 0)."""
        return max(self.own_exit_code, self.alternative.own_exit_code if self.alternative else 0)


def check_config(path: str | Path, overrides: Sequence[str] = (), **options: Any) -> CheckResult:
    """:func:`check_configs` for the one config at ``path``."""
    return check_configs([path], overrides, **options)[0]


def check_configs(
    paths: Sequence[str | Path],
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
) -> list[CheckResult]:
    """Judge each config in ``paths`` (the same ``overrides`` for each) on this machine, against
    ``lock`` if given, and with anemoi-training's schema (``schema``) where installed, importing
    only what ``trust`` allows. The configs' schemas and entries are judged in one child (the
    imports paid once); each config is composed in a child of its own, as it is read."""
    options = {k: v for k, v in locals().items() if k not in ("paths", "overrides", "_shape")}
    readings = [
        _reading(path, overrides, _shape, lock=lock, mode=mode, qk_norm=qk_norm, compose=compose,
                 allow_semantics_change=allow_semantics_change, schema=schema, trust=trust)
        for path in paths
    ]  # fmt: skip
    answers = _schema_and_entries(readings, timeout)
    results = [_finished(r, *answer) for r, answer in zip(readings, answers, strict=True)]
    for path, result in zip(paths, results, strict=True):
        if _shape is None and result.config.alternative:  # ambiguous: checked the other way too
            result.alternative = check_config(
                path, overrides, **options, _shape=result.config.alternative
            )
    return results


@dataclass
class _Reading:
    """One config read and judged up to what its children answer."""

    config: Config
    findings: list[Finding]
    run: SchemaRun | str
    at_schema: int  # the schema's errors go here, once it has run with the entries
    expected: dict[str, Exported]
    own: list[Any]  # the blocks with content of their own
    facts: dict[str, dict[str, Any]]
    requests: list[EntryCheckRequest]


def _reading(
    path: str | Path,
    overrides: Sequence[str],
    shape: str | None,
    *,
    lock: KernelLock | None,
    mode: str | None,
    qk_norm: bool,
    allow_semantics_change: bool,
    compose: bool,
    schema: bool,
    trust: Trust,
) -> _Reading:
    """The config at ``path`` read (composed in a child where it must be) and judged up to what
    needs a child: its schema run and the entry requests."""
    config = read_config(path, overrides, compose_overlays=compose, trust=trust, shape=shape)
    findings: list[Finding] = list(config.findings)
    run: SchemaRun | str = checks.schema_run(config) if schema else "not run: --no-schema"
    at_schema = len(findings)
    findings.extend(checks.lost_wrappers(config))
    findings.extend(components.attention_findings(config.tree, lock, mode))
    findings.extend(components.graph_findings(config.tree, lock))
    findings.extend(components.gated_findings(config.tree, lock))
    findings.extend(checks.components_without_blocks(config, lock_given=lock is not None))
    expected: dict[str, Exported] = {}
    if lock is not None:
        try:
            exported = export(lock, mode, qk_norm=qk_norm, verify_environment=False)
            expected = {e.key: e for e in exported}
        except LockError as exc:
            problem = f"the lock cannot be resolved here: {exc.problem}"
            findings.append(Finding("error", "lock", lock.path or "<lock>", problem, exc.fix or ""))
    own = [b for b in config.blocks if b.content is not None]
    facts: dict[str, dict[str, Any]] = {b.where: {} for b in own}
    requests = _requests(own, expected, trust, allow_semantics_change, findings, facts)
    return _Reading(config, findings, run, at_schema, expected, own, facts, requests)


def _finished(
    r: _Reading, schema_status: str, schema_errors: list[Finding], results: list[EntryCheckReply]
) -> CheckResult:
    """The reading's result, once its children answered."""
    findings = r.findings
    findings[r.at_schema : r.at_schema] = schema_errors
    content = {b.where: b.content or {} for b in r.own}
    for req, res in zip(r.requests, results, strict=True):
        block = req.where[: -len(req.key) - 1]
        r.facts[block][req.key] = res.facts
        if req.key in content[block]:  # not anemoi's default standing in for a key left out
            findings.extend(Finding(**f) for f in res.findings)
    for b in r.own:
        findings.extend(checks.merge_leftovers(b))
        if r.expected:
            findings.extend(checks.compare_with_lock(b, r.expected, r.facts[b.where]))
    pin = torch_pin_notes()
    return CheckResult(r.config, findings, r.expected, schema=schema_status, torch_pin=pin)


def _requests(
    own: Sequence[Any],
    expected: dict[str, Exported],
    trust: Trust,
    allow_semantics_change: bool,
    findings: list[Finding],
    facts: dict[str, dict[str, Any]],
) -> list[EntryCheckRequest]:
    """The entries to check in a child, with anemoi's default for each key the lock exports that a
    block leaves out; an entry that may not be imported goes to ``findings`` instead."""
    requests: list[EntryCheckRequest] = []
    for b in own:
        for key, entry in b.content.items():
            where = f"{b.where}.{key}"
            target = entry.get("_target_") if isinstance(entry, dict) else None
            refusal = trust.refusal(target) if isinstance(target, str) and target else None
            if refusal is not None:
                severity, problem, fix = refusal
                kind = "trust"
                try:  # found without importing anything
                    found = find_spec(str(target).split(".")[0]) is not None
                except (ImportError, ValueError):
                    found = False
                if severity == "warning" and not found:
                    kind, severity = "import", "error"  # said without importing anything
                    top = str(target).split(".")[0]
                    problem = f"{target!r} does not import here: No module named {top!r} (looked "
                    problem += "up without importing anything)"
                    fix = "install the library that provides it, or fix the dotted path"
                findings.append(Finding(severity, kind, where, problem, fix))
                facts[b.where][key] = not_imported(target)
                continue
            allow = allow_semantics_change
            requests.append(
                EntryCheckRequest(key=key, entry=entry, where=where, allow_semantics_change=allow)
            )
        for key in (k for k in expected if k not in b.content):
            where = f"{b.where}.{key}"
            requests.append(EntryCheckRequest(key=key, entry=ANEMOI_DEFAULTS[key], where=where))
    return requests


def _schema_and_entries(
    readings: Sequence[_Reading], timeout: float
) -> list[tuple[str, list[Finding], list[EntryCheckReply]]]:
    """Per reading: (schema status, its findings, one reply per request). One child answers for
    them all where there are several readings, or one whose schema runs with entries; where that
    child fails, each part of each reading runs again in a child of its own, so the findings say
    which failed."""
    replies: list[ConfigCheckReply | None] = [None] * len(readings)
    one = readings[0] if len(readings) == 1 else None  # alone: in one child where both parts run
    if len(readings) > 1 or (one is not None and isinstance(one.run, SchemaRun) and one.requests):
        batch = [
            ConfigCheckRequest(
                schema=r.run.request if isinstance(r.run, SchemaRun) else None,
                schema_memory=COMPOSE_MEMORY,
                entries=tuple(r.requests),
            ).to_json()
            for r in readings
        ]
        # each config's own time, as if each had a child of its own
        child = run_function(CHILDREN, "check", batch, timeout=timeout * len(readings))
        if child.ok and isinstance(child.value, list) and len(child.value) == len(readings):
            with contextlib.suppress(ProtocolError):  # not its answer: as if it had failed
                replies = [ConfigCheckReply.from_json(v) for v in child.value]
    out: list[tuple[str, list[Finding], list[EntryCheckReply]]] = []
    for r, reply in zip(readings, replies, strict=True):
        run = r.run
        if reply is not None and len(reply.entries) != len(r.requests):
            reply = None  # not its answer
        if reply is not None and isinstance(run, str) and reply.schema is None:
            out.append((run, [], list(reply.entries)))
        elif reply is not None and isinstance(run, SchemaRun) and reply.schema is not None:
            status, errors = schema_findings(r.config, timeout, run=run, reply=reply.schema)
            out.append((status, errors, list(reply.entries)))
        else:
            status, errors = schema_findings(r.config, timeout, run=run)
            out.append((status, errors, judge_entries(r.requests, timeout=timeout)))
    return out


# ---- export for one config -----------------------------------------------------------------------
@dataclass
class ConfigExport:
    """The overlay for one config: entries by name, per block path its key -> entry name, notes,
    and per component (its path in the config's tree) the keys the lock sets there."""

    config: Config
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    blocks: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)

    def overlay(self) -> dict[str, Any]:
        """The YAML-ready mapping to merge into the config (a model file: at its root)."""
        model: dict[str, Any] = {ENTRIES_NODE: dict(self.entries)}

        def node(parts: Sequence[str]) -> dict[str, Any]:
            at = model
            for part in parts:
                at = at.setdefault(part, {})
            return at

        model_file = self.config.shape == "model-file"
        for where, keys in self.blocks.items():  # "model.processor.layer_kernels" -> processor
            node(where.split(".")[1:-1])["layer_kernels"] = {
                key: f"${{model.{ENTRIES_NODE}.{name}}}" for key, name in keys.items()
            }
        for where, keys in self.components.items():  # "model.processor" -> processor
            node(where.split(".")[0 if model_file else 1 :]).update(keys)
        return model if model_file else {"model": model}


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
    it); ``ConventionError`` where a block's anemoi wrapper has no adapter for the lock's kernel."""
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
                note = "is a different layer, not a kernel choice: left as it is"
                out.notes.append((where, f"{current['_target_']} {note}"))
                continue
            same = should.entry == want.entry
            name = key if same else f"{key}_{should.entry['_target_'].rpartition('.')[2]}"
            out.entries.setdefault(name, should.entry)
            out.blocks.setdefault(block.where, {})[key] = name
            note = want.note if same else should.note
            if note:
                out.notes.append((where, note))
    model_file = config.shape == "model-file"
    note = (components.export_setting(lock) or ("", ""))[1]
    for w, backend in components.overlay_settings(config.tree, lock, model_file=model_file).items():
        where = w if model_file else f"model.{w}"
        out.components.setdefault(where, {})["graph_attention_backend"] = backend
        out.notes.append((f"{where}.graph_attention_backend", note))
    attention, said = components.attention_overlay(config.tree, lock, mode)
    for where, keys in attention.items():
        out.components.setdefault(where, {}).update(keys)
    out.notes.extend(said)
    gated = gated_mlp_export(lock)
    if gated is not None:
        for where, _ in components.gated_components(config.tree):
            out.components.setdefault(where, {}).update(gated[0])
            out.notes.append((f"{where}.mlp_implementation", gated[1]))
    return out
