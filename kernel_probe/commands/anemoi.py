"""``export --format anemoi`` (a lock as anemoi's ``layer_kernels`` block, or the overlay for one
``--config``) and ``check-config``: the arguments and rendering (the work: kernel_probe.anemoi)."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import yaml

from kernel_lock.anemoi import attention_export, export, gated_mlp_export
from kernel_lock.slots import MODES
from kernel_probe import __version__, output
from kernel_probe.anemoi.components import export_setting
from kernel_probe.anemoi.config import SHAPES
from kernel_probe.anemoi.entries import DEFAULT_TIMEOUT
from kernel_probe.anemoi.pipelines import CHECK_CONFIG_EXIT, check_configs, export_for_config
from kernel_probe.anemoi.reading import add_config_trust_argument, config_trust
from kernel_probe.errors import UsageError
from kernel_probe.output import add_flags, add_trust_argument, comment, safe


# ---- export -----------------------------------------------------------------------------------
def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """``kernel-probe export``'s arguments."""
    output.add_lock_argument(p)
    anemoi = "anemoi: the `layer_kernels:` YAML block anemoi-models reads (the only format so far)"
    p.add_argument("--format", choices=("anemoi",), default="anemoi", help=anemoi)
    mode = (
        "training: the pinned classes (this machine must match the lock); inference: the "
        "verified torch.nn twin where a pinned library cannot run here (default: the lock's own "
        "mode)"
    )
    p.add_argument("--mode", choices=MODES, default=None, help=mode)
    qk = "also emit QueryNorm/KeyNorm (bias-free, over head_dim) from the LayerNorm slot"
    add_flags(p, {"--qk-norm": qk})
    overlay = (
        "emit the overlay for this anemoi config (composed as anemoi-training composes it; "
        "Hydra overrides after `--`): every block gets the lock's entries, anemoi's wrappers kept"
    )
    p.add_argument("--config", default=None, metavar="CONFIG.yaml", help=overlay)
    add_flags(p, {"--no-compose": "with --config: read the file alone, without Hydra"})
    add_trust_argument(p)
    add_config_trust_argument(p)
    p.epilog = (
        "Hydra overrides for --config go after `--`, e.g.\n"
        "  kernel-probe export kernel-lock.toml --config my.yaml -- model=transformer_ens\n\n"
        + (p.epilog or "")
    )


def run_export(args: argparse.Namespace) -> int:
    """Print the lock's ``layer_kernels`` block (or ``--config``'s overlay) as YAML or JSON."""
    lock = output.open_lock(args, trust=args.trust)
    args.mode = args.mode or lock.mode
    if args.config is not None:
        return _export_for_config(args, lock)
    if args.overrides:
        raise UsageError(f"Hydra overrides ({' '.join(args.overrides)}) need --config CONFIG.yaml")
    entries = export(lock, args.mode, qk_norm=args.qk_norm)
    # the slots set on each component, not in layer_kernels: (JSON key, its value's key, what)
    parts: list[tuple[str, str, Any, str]] = [
        ("attention", "options", attention_export(lock, args.mode), _ATTENTION_WHERE),
        ("graph_attention", "graph_attention_backend", export_setting(lock), _GRAPH_WHERE),
        ("gated_mlp", "options", gated_mlp_export(lock), _GATED_MLP_WHERE),
    ]
    if args.json:
        data: dict[str, object] = {"layer_kernels": {e.key: e.entry for e in entries}}
        data |= {name: {key: got[0], "note": got[1]} for name, key, got, _ in parts if got}
        output.print_json(data)
        return 0
    text = render_yaml(entries, path=args.lock, mode=args.mode, digest=lock.digest)
    sys.stdout.write(text + "".join(_component(w, *got) for *_, got, w in parts if got is not None))
    return 0


def _export_for_config(args: argparse.Namespace, lock: Any) -> int:
    result = export_for_config(lock, args.config, args.overrides, **_config_options(args))
    if not args.json:
        sys.stdout.write(render_overlay(result, path=args.lock, mode=args.mode, digest=lock.digest))
        return 0
    output.print_json(
        {
            "config": args.config,
            "shape": result.config.shape,
            "composed": result.config.composed,
            "choices": result.config.choices,
            "overlay": result.overlay(),
            "notes": [{"where": w, "note": n} for w, n in result.notes],
            "findings": [f.to_json() for f in result.config.findings],
        }
    )
    return 0


def _config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``export --config`` and ``check-config`` pass alike."""
    compose = not args.no_compose
    return dict(mode=args.mode, qk_norm=args.qk_norm, compose=compose, trust=config_trust(args))


def _header(path: str, mode: str, digest: str) -> str:
    said = f"anemoi-models layer_kernels, exported by kernel-probe {__version__} from {path}"
    lines = (f"{said} ({mode} mode)", f"lock digest {digest or '(none)'}")
    return "".join(comment(line) + "\n" for line in lines)


class _Dumper(yaml.SafeDumper):
    """YAML's safe writer; a string with a control character double-quoted, so it is escaped
    (``\\n``) and never spans lines (the writer's own choice, single quotes, would break them)."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = '"' if output.CONTROL.search(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def _yaml(value: Any) -> list[str]:
    """``value``'s YAML lines: every string quoted and escaped by the YAML writer."""
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False).splitlines()


_WHERE = """\
# Where it goes (the processor, encoders and decoders inherit it through ${model.layer_kernels}):
# - a training config (the whole tree, no defaults list): under its `model:` node -> \
model.layer_kernels;
# - a model file (config/model/<name>.yaml; the file IS the model node): at the file's ROOT, beside
#   `processor:`, NOT under its own `model:` key (that key is the model class: there it would be
#   model.model.layer_kernels, which anemoi-training's schema rejects);
# - an overlay (a config with a `defaults:` list): Hydra would merge it key by key into the preset's
#   entries; use `kernel-probe export LOCK --config YOUR.yaml` instead.
# Keys not listed keep anemoi's defaults. Check with `kernel-probe check-config CONFIG --lock LOCK`.
"""


def render_yaml(entries: Any, *, path: str, mode: str, digest: str) -> str:
    """The exported entries as a commented ``layer_kernels:`` YAML block, saying where it goes."""
    text = _header(path, mode, digest) + _WHERE
    if not entries:
        return text + "layer_kernels: {}\n"
    lines = ["layer_kernels:"]
    for e in entries:
        if e.note:
            lines.append("  " + comment(f"{e.key}: {e.note}"))
        lines.extend("  " + line for line in _yaml({e.key: e.entry}))
    return text + "\n".join(lines) + "\n"


_ATTENTION_WHERE = """\
# Attention (slots.Attention): set these on every component with attention, beside its other keys:
# the processor of a transformer model (model.processor), and a TransformerMapper's encoder and
# decoder (model.encoder, model.decoder). They are no layer_kernels entry.
"""
_GATED_MLP_WHERE = """\
# GatedMLP (slots.GatedMLP): set this on every component with an MLP, beside its other keys: the
# processor (model.processor) and each encoder's and decoder's mapper (model.encoders.<id>.mapper,
# model.decoders.<id>.mapper). It is no layer_kernels entry; `export --config` writes it in place.
"""
_GRAPH_WHERE = """\
# GraphTransformer attention ([graph-attention]): set this on every GraphTransformer component: the
# processor of a GraphTransformer model (model.processor) and every GraphTransformer mapper
# (model.encoders.<name>.mapper, model.decoders.<name>.mapper); `--config` writes it for you.
"""


def _component(where: str, value: Any, note: str) -> str:
    """A slot set on each component, not in layer_kernels: comments saying where, then its YAML
    (the graph attention backend as a key, the others' options under ``processor:``)."""
    text = "\n" + where + (f"{comment(note)}\n" if note else "")
    if isinstance(value, str):
        return text + "".join(f"{line}\n" for line in _yaml({"graph_attention_backend": value}))
    if value:
        text += "processor:\n" + "".join(f"  {line}\n" for line in _yaml(value))
    return text


render_attention = functools.partial(_component, _ATTENTION_WHERE)
render_gated_mlp = functools.partial(_component, _GATED_MLP_WHERE)


def render_overlay(result: Any, *, path: str, mode: str, digest: str) -> str:
    """The overlay for one config as commented YAML: how it was read, its findings and notes."""
    config = result.config
    how = f"composed by Hydra ({config.model_choice()})" if config.composed else ""
    model_file = config.shape == "model-file"
    target = "its root (a model file is the model node)" if model_file else "its `model:` node"
    overrides = " -- " + " ".join(config.overrides) if config.overrides else ""
    lines = [
        comment(
            f"for {config.path}{overrides}: {config.shape}, {how or 'read alone, not composed'}"
        ),
        f"# Merge this into {target}. Each block points at the lock's entries through an "
        "interpolation, so Hydra",
        "# replaces the preset's entry whole instead of merging its keys; after composition "
        "every block holds exactly",
        "# these entries. Check with `kernel-probe check-config CONFIG --lock LOCK`.",
    ]
    lines += [
        comment(f"{f.severity}: {f.where}: {f.problem}")
        for f in config.findings
        if f.severity in ("error", "warning")
    ]
    lines += [comment(f"{where}: {note}") for where, note in result.notes]
    lines += _yaml(result.overlay())
    return _header(path, mode, digest) + "\n".join(lines).rstrip() + "\n"


# ---- check-config -----------------------------------------------------------------------------
def add_check_config_arguments(p: argparse.ArgumentParser) -> None:
    """``kernel-probe check-config``'s arguments, and its exit codes in the epilog."""
    config = (
        "anemoi config (YAML): a training config, an overlay with a `defaults:` list "
        "(composed as anemoi-training does), or a model config file (config/model/<name>.yaml)"
    )
    p.add_argument("config", nargs="+", help=config + "; several: checked together, exit the worst")
    compare = "also compare the LayerNorm/Linear entries with this lock"
    p.add_argument("--lock", default=None, help=compare)
    mode = "the lock's resolution to compare with (default: the lock's own mode)"
    p.add_argument("--mode", choices=MODES, default=None, help=mode)
    add_flags(
        p,
        {
            "--qk-norm": "compare QueryNorm/KeyNorm with the lock too (as `export --qk-norm`)",
            "--allow-semantics-change": "an RMSNorm under a LayerNorm/QueryNorm/KeyNorm key is "
            "deliberate: a warning, not an error",
            "--no-compose": "judge an overlay alone, without Hydra composition",
        },
    )
    timeout = f"how long importing the targets may take (default {DEFAULT_TIMEOUT:g})"
    p.add_argument(
        "--timeout", type=output.seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS", help=timeout
    )
    skip = "skip anemoi-training's own schema (BaseSchema), which check-config runs where it is"
    add_flags(p, {"--no-schema": f"{skip} installed"})
    add_trust_argument(p)
    add_config_trust_argument(p)
    codes = "\n".join(f"  {c}  {t}" for c, t in CHECK_CONFIG_EXIT.items())
    p.epilog = (
        "Hydra overrides go after `--`, e.g.\n  kernel-probe check-config my.yaml -- "
        f"model=transformer_ens\n\ncheck-config exit codes:\n{codes}\n\n{p.epilog}"
    )


def run_check_config(args: argparse.Namespace) -> int:
    """Check each config, print the findings (both readings of an ambiguous file), exit 0, 3 or 5:
    the worst over the configs."""
    lock = output.load_lock(args.lock, trust=args.trust) if args.lock else None
    args.mode = args.mode or (lock.mode if lock else "training")
    results = check_configs(
        args.config,
        args.overrides,
        lock=lock,
        allow_semantics_change=args.allow_semantics_change,
        timeout=args.timeout,
        schema=not args.no_schema,
        **_config_options(args),
    )
    code = max(r.exit_code for r in results)
    if args.json:
        bodies = [_json_both(args, path, r) for path, r in zip(args.config, results, strict=True)]
        if len(bodies) == 1:
            output.print_json(bodies[0])
            return code
        worst = next(b for b in bodies if b["exit_code"] == code)  # its failure speaks for all
        said = {k: v for k, v in worst.items() if k in ("ok", "error")}
        output.print_json({**said, "exit_code": code, "configs": bodies})
        return code
    say = output.console().print
    for path, result in zip(args.config, results, strict=True):
        _render(args, path, result, result.own_exit_code)
        alt = result.alternative
        if alt is not None:
            say(
                f"[bold]the file's kind is ambiguous[/] ({safe(result.config.why)}): also read as "
                f"{safe(SHAPES_SHORT[alt.config.shape])}"
            )
            _render(args, path, alt, alt.own_exit_code)
            say(f"exit {result.exit_code}: the worse of the two readings")
    if len(results) > 1:
        say(f"exit {code}: the worst of {len(results)} configs")
    return code


def _json_both(args: argparse.Namespace, path: str, result: Any) -> dict:
    """One config's JSON: its reading, and the other reading of an ambiguous file."""
    body = _json(args, path, result, result.exit_code)
    if result.alternative is not None:
        alt = result.alternative
        body["alternative"] = _json(args, path, alt, alt.own_exit_code)
    return body


SHAPES_SHORT = {
    "model-file": "a model file",
    "full": "a complete config",
    "overlay": "a Hydra overlay",
}


def _json(args: argparse.Namespace, path: str, result: Any, code: int) -> dict:
    config = result.config
    blocks = [
        {
            "where": b.where,
            "inherits": b.inherits,
            "keys": None if b.content is None else sorted(b.content),
        }
        for b in config.blocks
    ]
    return {
        **_failure(path, result, code),
        "config": path,
        "lock": args.lock,
        "mode": args.mode,
        "exit_code": code,
        "shape": config.shape,
        "shape_why": config.why,
        "composed": config.composed,
        "choices": config.choices,
        "overrides": config.overrides,
        "search_path": config.sources,
        "blocks": blocks,
        "expected": {k: e.entry for k, e in result.expected.items()},
        "schema": result.schema,
        "torch_pin": result.torch_pin,
        "findings": [f.to_json() for f in result.findings],
    }


def _failure(path: str, result: Any, code: int) -> dict:
    """``ok``, and with a failing exit code the one failure shape (kernel_probe.output.failure): its
    first error finding (the others are under ``findings``)."""
    if code == 0:
        return {"ok": True}
    errors = [f for f in result.findings if f.severity == "error"] or list(result.findings)
    problem, key, fix = "the config's layer_kernels blocks do not pass on this machine", None, None
    if errors:
        first, more = errors[0], len(errors) - 1
        said = f" (and {more} more, under findings)" if more else ""
        problem, key, fix = f"{first.where}: {first.problem}{said}", first.where, first.fix
    return output.failure(problem, code, kind="ConfigFindings", file=path, key=key, fix=fix)


STYLE = {"error": "bold red", "warning": "yellow", "note": "dim"}
_VERDICT = {0: "[green]ok[/]", 3: "[red]disagrees with the lock[/]", 5: "[red]errors[/]"}


def _render(args: argparse.Namespace, path: str, result: Any, code: int) -> None:
    say, config = output.console().print, result.config
    against = f" against {safe(args.lock)} ({args.mode} mode)" if args.lock else ""
    say(f"[bold]{safe(path)}[/]{against}")
    read = SHAPES[config.shape]
    if config.composed:
        read += f"; composed by Hydra as anemoi-training would ({config.model_choice()})"
    say(f"  read as {safe(read)}" + (f", because of {safe(config.why)}" if config.why else ""))
    for b in config.blocks:
        if b.inherits:
            say(f"  {safe(b.where)}: inherits {safe(b.inherits)}")
        else:
            keys = ", ".join(b.content) or "no keys: anemoi's defaults"
            via = f" (through {safe(b.source)})" if b.source else ""
            say(f"  {safe(b.where)}{via}: {safe(keys)}")
    say(f"  anemoi-training's schema: {safe(result.schema)}")
    for note in result.torch_pin:
        say(f"  [yellow]note:[/] {safe(note)}")
    if result.expected:
        exported = ", ".join(f"{k} -> {e.entry['_target_']}" for k, e in result.expected.items())
        say("  the lock exports: " + safe(exported))
    severities = ("error", "warning", "note")
    for f in sorted(result.findings, key=lambda f: severities.index(f.severity)):
        style = STYLE[f.severity]
        say(f"[{style}]{f.severity}[/] {safe(f'[{f.kind}]')} {safe(f.where)}: {safe(f.problem)}")
        if f.fix:
            say(f"    fix: {safe(f.fix)}")
    n = {s: sum(f.severity == s for f in result.findings) for s in severities}
    say(f"{_VERDICT[code]}: {n['error']} error(s), {n['warning']} warning(s), {n['note']} note(s)")
