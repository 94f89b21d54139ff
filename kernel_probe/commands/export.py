"""``kernel-probe export --format anemoi``: a lock as anemoi-models' ``layer_kernels`` block, or
with ``--config`` the overlay that puts the lock's entries into every block of one anemoi config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kernel_lock.format.slots import MODES
from kernel_probe import __version__, output
from kernel_probe.anemoi.reading import add_config_trust_argument, config_trust
from kernel_probe.commands.lockfile import (
    DEFAULT_LOCK,
    add_trust_argument,
    default_lock_path,
    load_lock,
)
from kernel_probe.errors import UsageError


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """``kernel-probe export``'s arguments."""
    p.add_argument(
        "lock",
        nargs="?",
        default=None,
        help=f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})",
    )
    p.add_argument(
        "--format",
        choices=("anemoi",),
        default="anemoi",
        help="anemoi: the `layer_kernels:` YAML block anemoi-models reads (the only format so far)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="training: the pinned classes (this machine must match the lock); inference: the "
        "verified "
        "torch.nn twin where a pinned library cannot run here (default: the lock's own mode)",
    )
    p.add_argument(
        "--qk-norm",
        action="store_true",
        help="also emit QueryNorm/KeyNorm (bias-free, over head_dim) from the LayerNorm slot",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="CONFIG.yaml",
        help="emit the overlay for this anemoi config (composed as anemoi-training composes "
        "it; Hydra "
        "overrides after `--`): every block gets the lock's entries, anemoi's wrappers kept",
    )
    p.add_argument(
        "--no-compose",
        action="store_true",
        help="with --config: read the file alone, without Hydra",
    )
    add_trust_argument(p)
    add_config_trust_argument(p)
    p.epilog = (
        "Hydra overrides for --config go after `--`, e.g.\n"
        "  kernel-probe export kernel-lock.toml --config my.yaml -- model=transformer_ens\n\n"
        + (p.epilog or "")
    )


def run_export(args: argparse.Namespace) -> int:
    """Print the lock's ``layer_kernels`` block (or the overlay for ``--config``) as YAML or
    JSON."""
    from kernel_lock.anemoi import attention_export, export, gated_mlp_export

    path = args.lock or default_lock_path()
    lock = load_lock(path, trust=args.trust)
    args.mode = args.mode or lock.mode
    if args.config is None:
        if args.overrides:
            raise UsageError(
                f"Hydra overrides ({' '.join(args.overrides)}) need --config CONFIG.yaml"
            )
        from kernel_probe.anemoi.components import export_setting

        entries = export(lock, args.mode, qk_norm=args.qk_norm)
        attention = attention_export(lock, args.mode)
        graph = export_setting(lock)
        gated = gated_mlp_export(lock)
        if args.json:
            data: dict[str, object] = {"layer_kernels": {e.key: e.entry for e in entries}}
            if attention is not None:
                data["attention"] = {"options": attention[0], "note": attention[1]}
            if graph is not None:
                data["graph_attention"] = {"graph_attention_backend": graph[0], "note": graph[1]}
            if gated is not None:
                data["gated_mlp"] = {"options": gated[0], "note": gated[1]}
            output.print_json(data)
            return 0
        sys.stdout.write(render_yaml(entries, path=path, mode=args.mode, digest=lock.digest))
        if attention is not None:
            sys.stdout.write(render_attention(*attention))
        if graph is not None:
            sys.stdout.write(render_graph_attention(*graph))
        if gated is not None:
            sys.stdout.write(render_gated_mlp(*gated))
        return 0
    from kernel_probe.anemoi.pipelines import export_for_config

    result = export_for_config(
        lock,
        args.config,
        args.overrides,
        mode=args.mode,
        qk_norm=args.qk_norm,
        compose=not args.no_compose,
        trust=config_trust(args),
    )
    if args.json:
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
    sys.stdout.write(render_overlay(result, path=path, mode=args.mode, digest=lock.digest))
    return 0


def _header(path: str, mode: str, digest: str) -> list[str]:
    return [
        f"# anemoi-models layer_kernels, exported by kernel-probe {__version__} from {path} "
        f"({mode} mode)",
        f"# lock digest {digest or '(none)'}",
    ]


def render_yaml(entries, *, path: str, mode: str, digest: str) -> str:
    """The exported entries as a commented ``layer_kernels:`` YAML block, saying where it goes."""
    import yaml

    lines = [
        *_header(path, mode, digest),
        "# Where it goes (the processor, encoders and decoders inherit it through "
        "${model.layer_kernels}):",
        "# - a training config (the whole tree, no defaults list): under its `model:` node -> "
        "model.layer_kernels;",
        "# - a model file (config/model/<name>.yaml; the file IS the model node): at the "
        "file's ROOT, beside",
        "#   `processor:`, NOT under its own `model:` key (that key is the model class: there "
        "it would be",
        "#   model.model.layer_kernels, which anemoi-training's schema rejects);",
        "# - an overlay (a config with a `defaults:` list): Hydra would merge it key by key "
        "into the preset's",
        "#   entries; use `kernel-probe export LOCK --config YOUR.yaml` instead.",
        "# Keys not listed keep anemoi's defaults. Check with `kernel-probe check-config "
        "CONFIG --lock LOCK`.",
    ]
    if not entries:
        return "\n".join([*lines, "layer_kernels: {}", ""])
    lines.append("layer_kernels:")
    for e in entries:
        if e.note:
            lines.append(f"  # {e.key}: {e.note}")
        body = yaml.safe_dump({e.key: e.entry}, sort_keys=False, default_flow_style=False)
        lines.extend("  " + line for line in body.splitlines())
    return "\n".join(lines) + "\n"


def _processor_block(comments: Sequence[str], options: dict) -> str:
    """``comments`` (lines without their ``# ``), then ``processor:`` with ``options`` as YAML under
    it (none: the comments only): how the slots set on each component, not in layer_kernels, are
    written."""
    import yaml

    lines = ["", *(f"# {line}" for line in comments)]
    if options:
        body = yaml.safe_dump(options, sort_keys=False, default_flow_style=False)
        lines += ["processor:", *("  " + line for line in body.splitlines())]
    return "\n".join(lines) + "\n"


# where the Attention slot's keys go (comment lines of its block)
ATTENTION_WHERE = (
    "Attention (slots.Attention): set these on every component with attention, beside its "
    "other keys:",
    "the processor of a transformer model (model.processor), and a TransformerMapper's encoder and",
    "decoder (model.encoder, model.decoder). They are no layer_kernels entry.",
)


def render_attention(options: dict, note: str) -> str:
    """The Attention slot's keys as a commented YAML block: they go on each component with
    attention."""
    return _processor_block([*ATTENTION_WHERE, *([note] if note else [])], options)


def render_graph_attention(backend: str, note: str) -> str:
    """The lock's [graph-attention] as a commented YAML key: it goes on each GraphTransformer
    component."""
    return "\n".join(
        [
            "",
            "# GraphTransformer attention ([graph-attention]): set this on every "
            "GraphTransformer component: the",
            "# processor of a GraphTransformer model (model.processor) and every "
            "GraphTransformer mapper",
            "# (model.encoders.<name>.mapper, model.decoders.<name>.mapper); `--config` writes "
            "it for you.",
            f"# {note}",
            f"graph_attention_backend: {backend}",
            "",
        ]
    )


# where the GatedMLP slot's key goes (comment lines of its block)
GATED_MLP_WHERE = (
    "GatedMLP (slots.GatedMLP): set this on every component with an MLP, beside its other "
    "keys: the",
    "processor (model.processor) and each encoder's and decoder's mapper "
    "(model.encoders.<id>.mapper,",
    "model.decoders.<id>.mapper). It is no layer_kernels entry; `export --config` writes it in "
    "place.",
)


def render_gated_mlp(options: dict, note: str) -> str:
    """The GatedMLP slot's key as a commented YAML block: it goes on each component with an MLP."""
    return _processor_block([*GATED_MLP_WHERE, note], options)


def render_overlay(result, *, path: str, mode: str, digest: str) -> str:
    """The overlay for one config as commented YAML: how the config was read, its findings and
    notes."""
    import yaml

    config = result.config
    how = (
        f"composed by Hydra ({config.model_choice()})"
        if config.composed
        else "read alone, not composed"
    )
    target = (
        "its root (a model file is the model node)"
        if config.shape == "model-file"
        else "its `model:` node"
    )
    lines = [
        *_header(path, mode, digest),
        f"# for {config.path}{' -- ' + ' '.join(config.overrides) if config.overrides else ''}: "
        f"{config.shape}, {how}",
        f"# Merge this into {target}. Each block points at the lock's entries through an "
        "interpolation, so Hydra",
        "# replaces the preset's entry whole instead of merging its keys; after composition "
        "every block holds exactly",
        "# these entries. Check with `kernel-probe check-config CONFIG --lock LOCK`.",
    ]
    for f in config.findings:
        if f.severity in ("error", "warning"):
            lines.append(f"# {f.severity}: {f.where}: {f.problem}")
    for where, note in result.notes:
        lines.append(f"# {where}: {note}")
    lines.append(
        yaml.safe_dump(result.overlay(), sort_keys=False, default_flow_style=False).rstrip()
    )
    return "\n".join(lines) + "\n"
