"""``kernel-probe check-config``: an anemoi config's ``layer_kernels`` blocks, judged on this
machine and against a lock."""

from __future__ import annotations

import argparse

from kernel_lock.format.slots import MODES
from kernel_probe import output
from kernel_probe.anemoi.reading import add_config_trust_argument, config_trust
from kernel_probe.commands.lockfile import add_trust_argument, load_lock
from kernel_probe.commands.numbers import seconds
from kernel_probe.errors import UsageError
from kernel_probe.output import safe


def add_check_config_arguments(p: argparse.ArgumentParser) -> None:
    """``kernel-probe check-config``'s arguments, and its exit codes in the epilog."""
    from kernel_probe.anemoi.entries import DEFAULT_TIMEOUT
    from kernel_probe.anemoi.pipelines import CHECK_CONFIG_EXIT

    p.add_argument(
        "config",
        help="anemoi config (YAML): a training config, an overlay with a `defaults:` list "
        "(composed as anemoi-training does), or a model config file (config/model/<name>.yaml)",
    )
    p.add_argument(
        "--lock", default=None, help="also compare the LayerNorm/Linear entries with this lock"
    )
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
            "an RMSNorm under a LayerNorm/QueryNorm/KeyNorm key is deliberate: a warning, not "
            "an error",
        ),
        ("--no-compose", "judge an overlay alone, without Hydra composition"),
    ):
        p.add_argument(flag, action="store_true", help=what)
    p.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long importing the targets may take (default {DEFAULT_TIMEOUT:g})",
    )
    p.add_argument(
        "--no-schema",
        action="store_true",
        help="skip anemoi-training's own schema (BaseSchema), which check-config runs where it "
        "is installed",
    )
    add_trust_argument(p)
    add_config_trust_argument(p)
    codes = "\n".join(f"  {c}  {t}" for c, t in CHECK_CONFIG_EXIT.items())
    p.epilog = (
        "Hydra overrides go after `--`, e.g.\n  kernel-probe check-config my.yaml -- "
        f"model=transformer_ens\n\ncheck-config exit codes:\n{codes}\n\n{p.epilog}"
    )


def run_check_config(args: argparse.Namespace) -> int:
    """Check the config, print the findings (both readings of an ambiguous file), exit 0, 3 or 5."""
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
        trust=config_trust(args),
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


SHAPES_SHORT = {
    "model-file": "a model file",
    "full": "a complete config",
    "overlay": "a Hydra overlay",
}


def _failure(args: argparse.Namespace, result, code: int) -> dict:
    """``ok``, and with a failing exit code the one failure shape (kernel_probe.output.failure): its
    first error finding (the others are under ``findings``)."""
    if code == 0:
        return {"ok": True}
    errors = [f for f in result.findings if f.severity == "error"] or list(result.findings)
    first = errors[0] if errors else None
    problem = (
        f"{first.where}: {first.problem}"
        + (f" (and {len(errors) - 1} more, under findings)" if len(errors) > 1 else "")
        if first
        else "the config's layer_kernels blocks do not pass on this machine"
    )
    return output.failure(
        problem,
        code,
        kind="ConfigFindings",
        file=args.config,
        key=first.where if first else None,
        fix=first.fix if first else None,
    )


def _json(args: argparse.Namespace, result, code: int) -> dict:
    config = result.config
    return {
        **_failure(args, result, code),
        "config": args.config,
        "lock": args.lock,
        "mode": args.mode,
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
    con.print(
        f"[bold]{safe(args.config)}[/]"
        + (f" against {safe(args.lock)} ({args.mode} mode)" if args.lock else "")
    )
    read = SHAPES[config.shape]
    if config.composed:
        read += f"; composed by Hydra as anemoi-training would ({config.model_choice()})"
    con.print(
        f"  read as {safe(read)}" + (f", because of {safe(config.why)}" if config.why else "")
    )
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
        con.print(
            f"[{STYLE[f.severity]}]{f.severity}[/] {safe(f'[{f.kind}]')} {safe(f.where)}: "
            f"{safe(f.problem)}"
        )
        if f.fix:
            con.print(f"    fix: {safe(f.fix)}")
    counts = {
        s: sum(f.severity == s for f in result.findings) for s in ("error", "warning", "note")
    }
    verdict = {0: "[green]ok[/]", 3: "[red]disagrees with the lock[/]", 5: "[red]errors[/]"}[code]
    con.print(
        f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['note']} note(s)"
    )
