"""kernel-probe check: the verdict table (candidates x dtypes) for this machine."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from kernel_lock.slots import DTYPES, short_dtype
from kernel_probe import output
from kernel_probe import slots as slot_behaviour
from kernel_probe.errors import ForcedUnusable
from kernel_probe.isolation.protocol import INTERPRETED
from kernel_probe.output import count, safe, seconds
from kernel_probe.probe import planning
from kernel_probe.probe.judge import Policy
from kernel_probe.probe.limits import CHECK_HIDDEN, CHECK_TIMEOUT, COMPILED_FACTOR, IMPORT_TIMEOUT
from kernel_probe.probe.report import Report, Verdict


def add_candidate_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by `check` and the main probe."""
    offer = "offer a third-party class for a slot (repeatable); it is judged like the built-ins"
    cls = "SLOT=dotted.path.Class"
    p.add_argument("--candidate", action="append", default=[], metavar=cls, help=offer)
    when_named = ", ".join(s.name for s in slot_behaviour.SLOTS.values() if not s.spec.by_default)
    only = f"only these slots (repeatable; default: every slot but {when_named}, which is checked "
    p.add_argument("--slot", action="append", default=[], metavar="SLOT", help=f"{only}when named)")
    for s in slot_behaviour.SLOTS.values():  # what the model declares of each slot
        if (o := s.option) is not None:
            p.add_argument(o.flag, default="", metavar=o.metavar, choices=o.choices, help=o.help)
    secs: dict[str, Any] = dict(type=seconds, metavar="SECONDS")
    imports = (
        f"seconds importing one candidate's library may take (default {IMPORT_TIMEOUT:g}): a "
        "library that hangs on import costs this much"
    )
    p.add_argument("--import-timeout", default=IMPORT_TIMEOUT, help=imports, **secs)
    checks = (
        f"seconds the checks of one candidate may take once imported (default {CHECK_TIMEOUT:g}; "
        f"{COMPILED_FACTOR}x for torch.compile candidates, which compile on their first calls)"
    )
    p.add_argument("--timeout", default=CHECK_TIMEOUT, help=checks, **secs)
    output.add_flags(p, CANDIDATE_SWITCHES)


# what the candidates are and how they are judged: on/off flags of `check` and the main probe
CANDIDATE_SWITCHES = {
    "--with-compile": "also probe the torch.compile candidates on CPU (slow: C++ compilation per "
    "shape)",
    "--no-plugins": "ignore kernel_probe.probe.candidates entry points",
    "--allow-init-change": "accept a candidate whose fresh parameters start differently from "
    "torch.nn's (the lock records it)",
    "--strict-dtype": "reject any output dtype different from torch.nn's, instead of judging it "
    "by its consequence",
    "--allow-approximation": "accept an Activation computing an approximation of the model's "
    "function (a tanh GELU for an erf model), judged against what it computes; the lock records "
    "the difference",
}


def declared_from(args: argparse.Namespace) -> dict[str, str]:
    """Per slot, what the model declares of it on the command line (``Slot.option``)."""
    return {
        s.name: getattr(args, s.option.dest)
        for s in slot_behaviour.SLOTS.values()
        if s.option is not None
    }


def policy_from(args: argparse.Namespace) -> Policy:
    """The judging policy the command line asks for (--allow-init-change, --strict-dtype)."""
    return Policy(
        allow_init_change=args.allow_init_change,
        strict_dtype=args.strict_dtype,
        allow_approximation=args.allow_approximation,
    )


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `kernel-probe check`."""
    add_candidate_arguments(p)
    dtypes = "fp32, bf16 or fp16 (repeatable; default: all the device supports)"
    p.add_argument("--dtype", action="append", default=[], metavar="DTYPE", help=dtypes)
    regime = "plain low precision, under torch.autocast, or both (default)"
    p.add_argument("--regime", choices=("true", "mixed", "both"), default="both", help=regime)
    hidden = (
        "normalised (input) size of the correctness inputs (default 1000, deliberately "
        "not a power of two); 64 checks norms at anemoi's QueryNorm/KeyNorm head_dim"
    )
    p.add_argument("--hidden", type=count(1, 65536), default=None, metavar="N", help=hidden)
    graph = (
        "check anemoi's GraphTransformer attention instead of the slots: triton, pyg or "
        "module.function (f(q, k, v, e, edge_index, size)), repeatable; fwd+bwd vs float64 on an "
        "O96-degree graph (docs/checks.md, GraphAttention)"
    )
    p.add_argument("--graph-attention", action="append", default=[], metavar="BACKEND", help=graph)


def run_check(args: argparse.Namespace) -> int:
    """`kernel-probe check`: every candidate checked here (none timed), as a table or JSON."""
    from kernel_probe.probe.check import check_all, dtype_plan, parse_dtype  # the worker: heavy

    dtypes = [parse_dtype(d) for d in args.dtype] or list(DTYPES)
    if args.graph_attention:
        return _graph_attention(args.graph_attention, dtypes, args.json)
    plan = dtype_plan(dtypes, ("true", "mixed") if args.regime == "both" else (args.regime,))
    candidates, problems = planning.gather_candidates(args.candidate, plugins=not args.no_plugins)
    for problem in problems:
        output.warn(problem)
    device = planning.detect_device()
    for problem in slot_behaviour.load_plugins() if not args.no_plugins else []:
        output.warn(problem)
    slots = planning.select_slots(args.slot)
    planning.refuse_declared(declared := declared_from(args))
    canonical = {n: slot_behaviour.slot(n).canonical(d, None) for n, d in declared.items() if d}
    progress = None if args.json else (lambda slot, cid: output.info(f"checking {slot}: {cid} ..."))
    reports = check_all(
        slots,
        candidates,
        device["type"],
        plan,
        arch=device["arch"],
        timeout=args.timeout,
        import_timeout=args.import_timeout,
        with_compile=args.with_compile,
        hidden=args.hidden,
        policy=policy_from(args),
        progress=progress,
        canonical=canonical,
    )
    failure = _not_importable(reports)
    hidden = args.hidden or CHECK_HIDDEN
    if args.json:
        body = {
            "device": device,
            "hidden": hidden,
            "plan": [{"dtype": d, "regime": r} for d, r in plan],
            "problems": problems,
            "slots": {slot: [r.to_json() for r in rs] for slot, rs in reports.items()},
        }
        output.print_json(output.with_failure(body, failure))
        return failure.exit_code if failure else 0
    render_verdicts(reports, plan, device, hidden=hidden)
    if failure is not None:
        output.error(str(failure))
        return failure.exit_code
    return 0


def _not_importable(reports: Mapping[str, list[Report]]) -> ForcedUnusable | None:
    """A class the user offered that cannot even be imported fails the command (exit 3): nothing
    asked for was checked (a crash or a timeout is a verdict on the class)."""
    offered = [
        r
        for rs in reports.values()
        for r in rs
        if r.id.startswith("custom:") and r.status == "unavailable"  # never ran: not imported
    ]
    if not offered:
        return None
    return ForcedUnusable(
        "; ".join(
            f"--candidate {r.id.removeprefix('custom:')} is {r.status}: "
            f"{r.reasons[0] if r.reasons else ''}"
            for r in offered
        ),
        fix="install its package or put its directory on PYTHONPATH, and check the dotted path",
    )


def _graph_attention(backends: Sequence[str], dtypes: Sequence[str], as_json: bool) -> int:
    """`check --graph-attention`: each backend's verdict."""
    # reason: the worker's machinery, which the warm path (commands/probe imports this) never loads
    from kernel_probe.probe.graph_attention import check_backend

    device = planning.detect_device()["type"]
    reports = [check_backend(b, device, dtypes) for b in backends]
    if as_json:
        output.print_json({"device": device, "graph_attention": [r.to_json() for r in reports]})
        return 0
    con = output.console()
    for r in reports:
        ratios = ", ".join(
            f"{v.dtype} {v.worst_ratio:.3g}" for v in r.verdicts if v.worst_ratio is not None
        )
        line = f"graph attention {r.backend} on {device}: {r.status}" + (
            f" (worst ratio {ratios})" if ratios else ""
        )
        con.print(safe(line + (" [interpreted]" if r.interpreted else "")))
        for reason in r.reasons[:4]:
            con.print(f"  {safe(reason)}")
    return 0


STATUS_STYLE = {
    "accepted": "green",
    "rejected": "red",
    "crashed": "red",
    "timeout": "red",
    "unavailable": "yellow",
    "skipped": "dim",
}


def status_cell(rep: Report, chosen: bool = False) -> str:
    """A candidate's status in a table, marked where it ran interpreted."""
    style = STATUS_STYLE.get(rep.status, "")
    status = "[bold green]chosen[/]" if chosen else f"[{style}]{rep.status}[/]"
    return status + (" [yellow](interpreted)[/]" if rep.interpreted else "")


def _cell(v: Verdict | None) -> str:
    """One (dtype, regime) cell of the verdict table."""
    if v is None:
        return "-"
    if v.status == "accepted":
        return f"[green]ok[/] {v.worst_ratio:.2f}"
    if v.worst_ratio is not None and v.status == "rejected":
        return f"[red]x[/] {v.worst_ratio:.2g}"
    return f"[{STATUS_STYLE.get(v.status, '')}]{v.status[:7]}[/]"


def render_verdicts(
    reports: Mapping[str, list[Report]],
    plan: Sequence[tuple[str, str]],
    device: Mapping[str, Any],
    hidden: int = CHECK_HIDDEN,
) -> None:
    """Per slot, a table of candidates x (dtype, regime) cells, then why each was not accepted."""
    con = output.console()
    con.print(f"device: {device['type']} ({safe(str(device['name']))}); inputs {hidden} wide")
    for slot, rs in reports.items():
        table = output.table(slot)
        table.add_column("candidate", no_wrap=True)
        table.add_column("status", no_wrap=True, min_width=11)
        for d, r in plan:
            name = short_dtype(d) + ("+amp" if r == "mixed" else "")
            table.add_column(name, justify="right", no_wrap=True, min_width=7)
        table.add_column("det", no_wrap=True)
        table.add_column("s", justify="right", no_wrap=True)
        for rep in rs:
            by = {(v.dtype, v.regime): v for v in rep.verdicts}
            det = {True: "yes", False: "[yellow]no[/]", None: "-"}[rep.deterministic]
            took = "-" if rep.seconds is None else f"{rep.seconds:.1f}"
            cells = [_cell(by.get(key)) for key in plan]
            table.add_row(safe(rep.id), status_cell(rep), *cells, det, took)
        output.print_table(table)
        for rep in rs:
            _notes(con, rep)
    con.print(
        "det: forward and backward bitwise repeatable; s: seconds this candidate took (import "
        "and checks)"
    )
    con.print(
        "cells: worst error / tolerance (< 1 passes; tolerance = 4 x torch.nn's own error + 2 "
        "eps); +amp: under torch.autocast with fp32 parameters"
    )
    for footnote in (slot_behaviour.slot(name).footnote for name in reports):
        if footnote:
            con.print(footnote)


def _notes(con: Any, rep: Report) -> None:
    """Under a slot's table: what a candidate's verdict says besides its cells."""
    who = f"  [bold]{safe(rep.id)}[/]"
    if rep.interpreted:
        con.print(f"{who} {safe(INTERPRETED)}")
    if rep.status != "accepted" and rep.reasons:
        con.print(f"{who} {rep.status}: {safe(rep.reasons[0])}")
        for reason in rep.reasons[1:3]:
            con.print(f"      {safe(reason)}")
    if rep.status == "accepted":
        for change in rep.changes:
            con.print(f"{who} accepted with a change: {safe(change)}")
        if rep.migration:
            con.print(f"{who} state dict onto torch.nn's: {safe(', '.join(rep.migration))}")
