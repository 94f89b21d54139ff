"""anemoi-models subcommands: ``export --format anemoi`` (the lock as a layer_kernels block) and
``check-config`` (an anemoi config's layer_kernels blocks, judged on this machine and against a lock)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__, output
from ..errors import UsageError
from .lockcmds import DEFAULT_LOCK, _load, default_lock_path

MODES = ("training", "inference")


# ---- export ---------------------------------------------------------------------------------------
def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("lock", nargs="?", default=None, help=f"lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK})")
    p.add_argument("--format", choices=("anemoi",), default="anemoi",
                   help="anemoi: the `layer_kernels:` YAML block anemoi-models reads (the only format so far)")
    p.add_argument("--mode", choices=MODES, default="training",
                   help="training: the pinned classes (this machine must match the lock); inference: the verified "
                   "torch.nn twin where a pinned library cannot run here")
    p.add_argument("--qk-norm", action="store_true",
                   help="also emit QueryNorm/KeyNorm (bias-free, over head_dim) from the LayerNorm slot")
    p.add_argument("--json", action="store_true", help="the mapping as JSON instead of YAML")


def run_export(args: argparse.Namespace) -> int:
    from kernel_lock.anemoi import export

    path = args.lock or default_lock_path()
    lock = _load(path)
    entries = export(lock, args.mode, qk_norm=args.qk_norm)
    if args.json:
        output.print_json({"layer_kernels": {e.key: e.entry for e in entries}})
        return 0
    import sys

    sys.stdout.write(render_yaml(entries, path=path, mode=args.mode, digest=lock.digest))
    return 0


def render_yaml(entries, *, path: str, mode: str, digest: str) -> str:
    import yaml

    lines = [
        f"# anemoi-models layer_kernels, exported by kernel-probe {__version__} from {path} ({mode} mode)",
        f"# lock digest {digest or '(none)'}",
        "# Put it under `model:`; the processor, encoders and decoders inherit it through ${model.layer_kernels}.",
        "# Keys not listed keep anemoi's defaults. Check a config with `kernel-probe check-config CONFIG --lock LOCK`.",
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


# ---- check-config ---------------------------------------------------------------------------------
CHECK_CONFIG_EXIT = {
    0: "no errors (warnings and notes may be printed)",
    3: "the config is valid here but disagrees with the lock (or the lock cannot be resolved here)",
    5: "the config has errors: unreadable or malformed, unknown keys, targets that do not import, "
    "signatures that do not fit anemoi's calls, semantics changes",
}


def add_check_config_arguments(p: argparse.ArgumentParser) -> None:
    from ..anemoi_config import DEFAULT_TIMEOUT

    p.add_argument("config", help="anemoi config (YAML): a training config with `model:`, or a model config file")
    p.add_argument("--lock", default=None, help="also compare the LayerNorm/Linear entries with this lock")
    p.add_argument("--mode", choices=MODES, default="training", help="the lock's resolution to compare with (default training)")
    p.add_argument("--qk-norm", action="store_true", help="compare QueryNorm/KeyNorm with the lock too (as `export --qk-norm`)")
    p.add_argument("--allow-semantics-change", action="store_true",
                   help="an RMSNorm under a LayerNorm/QueryNorm/KeyNorm key is deliberate: a warning, not an error")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"how long importing the targets may take (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--json", action="store_true", help="findings as JSON")
    codes = "\n".join(f"  {c}  {t}" for c, t in CHECK_CONFIG_EXIT.items())
    p.epilog = f"check-config exit codes:\n{codes}\n\n{p.epilog}"


def run_check_config(args: argparse.Namespace) -> int:
    from kernel_lock.anemoi import ANEMOI_DEFAULTS, Finding, export
    from kernel_lock.errors import LockError

    from ..anemoi_config import compare_with_lock, find_blocks, judge_entries, load_config

    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    config = find_blocks(load_config(args.config))
    findings: list[Finding] = list(config.findings)
    expected: dict[str, dict[str, Any]] = {}
    if args.lock:
        lock = _load(args.lock)
        try:
            expected = {e.key: e.entry for e in export(lock, args.mode, qk_norm=args.qk_norm, verify_environment=False)}
        except LockError as exc:
            findings.append(Finding("error", "lock", args.lock, f"the lock cannot be resolved here: {exc.problem}", exc.fix or ""))
    own = [b for b in config.blocks if b.content is not None]
    requests: list[dict[str, Any]] = []
    for b in own:
        for key, entry in b.content.items():
            requests.append({"key": key, "entry": entry, "where": f"{b.where}.{key}", "block": b.where, "report": True,
                             "allow_semantics_change": args.allow_semantics_change})  # fmt: skip
        for key in expected:  # anemoi's default stands in for a key the block leaves out
            if key not in b.content:
                requests.append({"key": key, "entry": ANEMOI_DEFAULTS[key], "where": f"{b.where}.{key}", "block": b.where,
                                 "report": False})
    results = judge_entries(requests, timeout=args.timeout)
    facts: dict[str, dict[str, Any]] = {b.where: {} for b in own}
    for req, res in zip(requests, results):
        facts[req["block"]][req["key"]] = res["facts"]
        if req["report"]:
            findings.extend(Finding(**f) for f in res["findings"])
    if expected:
        for b in own:
            findings.extend(compare_with_lock(b.where, b.content, expected, facts[b.where]))
    errors = [f for f in findings if f.severity == "error"]
    code = 5 if any(f.kind != "lock" for f in errors) else 3 if errors else 0
    if args.json:
        output.print_json({
            "config": args.config, "lock": args.lock, "mode": args.mode, "ok": code == 0, "exit_code": code,
            "blocks": [{"where": b.where, "inherits": b.inherits, "keys": sorted(b.content) if b.content is not None else None}
                       for b in config.blocks],
            "expected": expected,
            "findings": [f.to_json() for f in findings],
        })  # fmt: skip
        return code
    _render(args, config.blocks, findings, expected, code)
    return code


STYLE = {"error": "bold red", "warning": "yellow", "note": "dim"}


def _render(args, blocks, findings, expected, code: int) -> None:
    from rich.markup import escape

    con = output.console()
    con.print(f"[bold]{escape(args.config)}[/]" + (f" against {escape(args.lock)} ({args.mode} mode)" if args.lock else ""))
    for b in blocks:
        if b.inherits:
            con.print(f"  {escape(b.where)}: inherits {escape(b.inherits)}")
        else:
            keys = ", ".join(b.content) or "no keys: anemoi's defaults"
            via = f" (through {escape(b.source)})" if b.source else ""
            con.print(f"  {escape(b.where)}{via}: {escape(keys)}")
    if expected:
        con.print("  the lock exports: " + escape(", ".join(f"{k} -> {v['_target_']}" for k, v in expected.items())))
    order = {"error": 0, "warning": 1, "note": 2}
    for f in sorted(findings, key=lambda f: order[f.severity]):
        con.print(f"[{STYLE[f.severity]}]{f.severity}[/] {escape(f'[{f.kind}]')} {escape(f.where)}: {escape(f.problem)}")
        if f.fix:
            con.print(f"    fix: {escape(f.fix)}")
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "note")}
    verdict = {0: "[green]ok[/]", 3: "[red]disagrees with the lock[/]", 5: "[red]errors[/]"}[code]
    con.print(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['note']} note(s)")
