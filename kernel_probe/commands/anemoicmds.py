"""anemoi-models subcommands: ``export --format anemoi`` (the lock as a layer_kernels block) and
``check-config`` (an anemoi config's layer_kernels blocks, judged on this machine and against a lock)."""

from __future__ import annotations

import argparse
import sys

from kernel_lock.slots import MODES
from kernel_probe import __version__, output
from kernel_probe.commands.lockfile import DEFAULT_LOCK, add_trust_argument, default_lock_path, load_lock
from kernel_probe.errors import UsageError
from kernel_probe.output import safe


def add_config_trust_argument(p: argparse.ArgumentParser) -> None:
    from kernel_probe.anemoi.config import OWN_TARGETS_FLAG

    p.add_argument(
        OWN_TARGETS_FLAG,
        action="store_true",
        help="import every public module the config's own layer_kernels entries name (default: only the import "
        "allow-list, anemoi-models and --trust; an entry outside them is reported as not checked). A `__main__` or "
        "private module is never imported",
    )


def _trust(args: argparse.Namespace):
    from kernel_probe.anemoi.config import Trust

    return Trust.granted(args.trust, own_targets=args.import_config_targets)


# ---- export ---------------------------------------------------------------------------------------
def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", nargs="?", default=None, help=f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})")
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
        help="training: the pinned classes (this machine must match the lock); inference: the verified "
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
        help="emit the overlay for this anemoi config (composed as anemoi-training composes it; Hydra "
        "overrides after `--`): every block gets the lock's entries, anemoi's wrappers kept",
    )
    p.add_argument("--no-compose", action="store_true", help="with --config: read the file alone, without Hydra")
    add_trust_argument(p)
    add_config_trust_argument(p)
    p.epilog = (
        "Hydra overrides for --config go after `--`, e.g.\n"
        "  kernel-probe export kernel-lock.toml --config my.yaml -- model=transformer_ens\n\n" + (p.epilog or "")
    )


def run_export(args: argparse.Namespace) -> int:
    from kernel_lock.anemoi import export

    path = args.lock or default_lock_path()
    lock = load_lock(path, trust=args.trust)
    args.mode = args.mode or lock.mode
    if args.config is None:
        if args.overrides:
            raise UsageError(f"Hydra overrides ({' '.join(args.overrides)}) need --config CONFIG.yaml")
        entries = export(lock, args.mode, qk_norm=args.qk_norm)
        if args.json:
            output.print_json({"layer_kernels": {e.key: e.entry for e in entries}})
            return 0
        sys.stdout.write(render_yaml(entries, path=path, mode=args.mode, digest=lock.digest))
        return 0
    from kernel_probe.anemoi.pipelines import export_for_config

    result = export_for_config(
        lock,
        args.config,
        args.overrides,
        mode=args.mode,
        qk_norm=args.qk_norm,
        compose=not args.no_compose,
        trust=_trust(args),
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


def _model_choice(config) -> str:
    model = config.choices.get("model")
    return f"model: {model}" if model else "no model preset selected"


def _header(path: str, mode: str, digest: str) -> list[str]:
    return [
        f"# anemoi-models layer_kernels, exported by kernel-probe {__version__} from {path} ({mode} mode)",
        f"# lock digest {digest or '(none)'}",
    ]


def render_yaml(entries, *, path: str, mode: str, digest: str) -> str:
    import yaml

    lines = [
        *_header(path, mode, digest),
        "# Where it goes (the processor, encoders and decoders inherit it through ${model.layer_kernels}):",
        "# - a training config (the whole tree, no defaults list): under its `model:` node -> model.layer_kernels;",
        "# - a model file (config/model/<name>.yaml; the file IS the model node): at the file's ROOT, beside",
        "#   `processor:`, NOT under its own `model:` key (that key is the model class: there it would be",
        "#   model.model.layer_kernels, which anemoi-training's schema rejects);",
        "# - an overlay (a config with a `defaults:` list): Hydra would merge it key by key into the preset's",
        "#   entries; use `kernel-probe export LOCK --config YOUR.yaml` instead.",
        "# Keys not listed keep anemoi's defaults. Check with `kernel-probe check-config CONFIG --lock LOCK`.",
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


def render_overlay(result, *, path: str, mode: str, digest: str) -> str:
    import yaml

    config = result.config
    how = f"composed by Hydra ({_model_choice(config)})" if config.composed else "read alone, not composed"
    target = "its root (a model file is the model node)" if config.shape == "model-file" else "its `model:` node"
    lines = [
        *_header(path, mode, digest),
        f"# for {config.path}{' -- ' + ' '.join(config.overrides) if config.overrides else ''}: {config.shape}, {how}",
        f"# Merge this into {target}. Each block points at the lock's entries through an interpolation, so Hydra",
        "# replaces the preset's entry whole instead of merging its keys; after composition every block holds exactly",
        "# these entries. Check with `kernel-probe check-config CONFIG --lock LOCK`.",
    ]
    for f in config.findings:
        if f.severity in ("error", "warning"):
            lines.append(f"# {f.severity}: {f.where}: {f.problem}")
    for where, note in result.notes:
        lines.append(f"# {where}: {note}")
    lines.append(yaml.safe_dump(result.overlay(), sort_keys=False, default_flow_style=False).rstrip())
    return "\n".join(lines) + "\n"


# ---- check-config ---------------------------------------------------------------------------------
def add_check_config_arguments(p: argparse.ArgumentParser) -> None:
    from kernel_probe.anemoi.config import DEFAULT_TIMEOUT
    from kernel_probe.anemoi.pipelines import CHECK_CONFIG_EXIT

    p.add_argument(
        "config",
        help="anemoi config (YAML): a training config, an overlay with a `defaults:` list "
        "(composed as anemoi-training does), or a model config file (config/model/<name>.yaml)",
    )
    p.add_argument("--lock", default=None, help="also compare the LayerNorm/Linear entries with this lock")
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="the lock's resolution to compare with (default: the lock's own mode)",
    )
    for flag, what in (
        ("--qk-norm", "compare QueryNorm/KeyNorm with the lock too (as `export --qk-norm`)"),
        (
            "--allow-semantics-change",
            "an RMSNorm under a LayerNorm/QueryNorm/KeyNorm key is deliberate: a warning, not an error",
        ),
        ("--no-compose", "judge an overlay alone, without Hydra composition"),
    ):
        p.add_argument(flag, action="store_true", help=what)
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long importing the targets may take (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--no-schema",
        action="store_true",
        help="skip anemoi-training's own schema (BaseSchema), which check-config runs where it is installed",
    )
    add_trust_argument(p)
    add_config_trust_argument(p)
    codes = "\n".join(f"  {c}  {t}" for c, t in CHECK_CONFIG_EXIT.items())
    p.epilog = (
        "Hydra overrides go after `--`, e.g.\n  kernel-probe check-config my.yaml -- model=transformer_ens\n\n"
        f"check-config exit codes:\n{codes}\n\n{p.epilog}"
    )


def run_check_config(args: argparse.Namespace) -> int:
    from kernel_probe.anemoi.pipelines import check_config

    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    lock = load_lock(args.lock, trust=args.trust) if args.lock else None
    args.mode = args.mode or (lock.mode if lock else "training")
    result = check_config(
        args.config,
        args.overrides,
        lock=lock,
        mode=args.mode,
        qk_norm=args.qk_norm,
        allow_semantics_change=args.allow_semantics_change,
        compose=not args.no_compose,
        timeout=args.timeout,
        schema=not args.no_schema,
        trust=_trust(args),
    )
    code = result.exit_code
    if args.json:
        body = _json(args, result, code)
        if result.alternative is not None:
            body["alternative"] = _json(args, result.alternative, result.alternative.own_exit_code)
        output.print_json(body)
        return code
    _render(args, result, result.own_exit_code)
    if result.alternative is not None:
        alt = result.alternative
        output.console().print(
            f"[bold]the file's kind is ambiguous[/] ({safe(result.config.why)}): also read as "
            f"{safe(SHAPES_SHORT[alt.config.shape])}"
        )
        _render(args, alt, alt.own_exit_code)
        output.console().print(f"exit {code}: the worse of the two readings")
    return code


SHAPES_SHORT = {"model-file": "a model file", "full": "a complete config", "overlay": "a Hydra overlay"}


def _json(args: argparse.Namespace, result, code: int) -> dict:
    config = result.config
    return {
        "config": args.config,
        "lock": args.lock,
        "mode": args.mode,
        "ok": code == 0,
        "exit_code": code,
        "shape": config.shape,
        "shape_why": config.why,
        "composed": config.composed,
        "choices": config.choices,
        "overrides": config.overrides,
        "search_path": config.sources,
        "blocks": [
            {
                "where": b.where,
                "inherits": b.inherits,
                "keys": sorted(b.content) if b.content is not None else None,
            }
            for b in config.blocks
        ],
        "expected": {k: e.entry for k, e in result.expected.items()},
        "schema": result.schema,
        "findings": [f.to_json() for f in result.findings],
    }


STYLE = {"error": "bold red", "warning": "yellow", "note": "dim"}


def _render(args, result, code: int) -> None:
    from kernel_probe.anemoi.config import SHAPES

    con = output.console()
    config = result.config
    con.print(f"[bold]{safe(args.config)}[/]" + (f" against {safe(args.lock)} ({args.mode} mode)" if args.lock else ""))
    read = SHAPES[config.shape]
    if config.composed:
        read += f"; composed by Hydra as anemoi-training would ({_model_choice(config)})"
    con.print(f"  read as {safe(read)}" + (f", because of {safe(config.why)}" if config.why else ""))
    for b in config.blocks:
        if b.inherits:
            con.print(f"  {safe(b.where)}: inherits {safe(b.inherits)}")
        else:
            keys = ", ".join(b.content) or "no keys: anemoi's defaults"
            via = f" (through {safe(b.source)})" if b.source else ""
            con.print(f"  {safe(b.where)}{via}: {safe(keys)}")
    con.print(f"  anemoi-training's schema: {safe(result.schema)}")
    if result.expected:
        con.print(
            "  the lock exports: "
            + safe(", ".join(f"{k} -> {e.entry['_target_']}" for k, e in result.expected.items()))
        )
    order = {"error": 0, "warning": 1, "note": 2}
    for f in sorted(result.findings, key=lambda f: order[f.severity]):
        con.print(f"[{STYLE[f.severity]}]{f.severity}[/] {safe(f'[{f.kind}]')} {safe(f.where)}: {safe(f.problem)}")
        if f.fix:
            con.print(f"    fix: {safe(f.fix)}")
    counts = {s: sum(f.severity == s for f in result.findings) for s in ("error", "warning", "note")}
    verdict = {0: "[green]ok[/]", 3: "[red]disagrees with the lock[/]", 5: "[red]errors[/]"}[code]
    con.print(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)")
