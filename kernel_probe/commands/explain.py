"""``kernel-probe explain [LOCK] SLOT``: why a lock chose what it chose for one slot (reason, twin,
correctness evidence, timings, the candidates not chosen)."""

from __future__ import annotations

import argparse
from typing import Any

import kernel_lock
from kernel_lock.slots import short_dtype, slot_name_fix
from kernel_probe import output
from kernel_probe.commands.lockfile import DEFAULT_LOCK, default_lock_path, load_lock
from kernel_probe.errors import UsageError
from kernel_probe.output import safe


def add_explain_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``kernel-probe explain``."""
    p.add_argument(
        "args",
        nargs="+",
        metavar="[LOCK] SLOT",
        help=f"the lock file (default: $KERNEL_LOCK or ./{DEFAULT_LOCK}) and the slot: "
        f"{', '.join(kernel_lock.SLOTS)}",
    )


def slot_argument(text: str) -> str:
    """A slot name from the command line; a wrong one is a usage error (exit 2) with the near
    miss."""
    if text in kernel_lock.SLOTS:
        return text
    raise UsageError(f"unknown slot {text!r}", fix=slot_name_fix(text))


def _looks_like_a_file(text: str) -> bool:
    """A lock's path rather than a mistyped slot: it exists, or is named like a TOML file or a
    path."""
    import os

    return os.path.exists(text) or text.endswith(".toml") or os.sep in text


def run_explain(args: argparse.Namespace) -> int:
    """``kernel-probe explain [LOCK] SLOT``: why the lock pins what it pins for one slot."""
    if len(args.args) > 2:
        raise UsageError(
            f"explain takes [LOCK] SLOT, got {len(args.args)} arguments: {' '.join(args.args)}"
        )
    if (
        len(args.args) == 1
        and args.args[0] not in kernel_lock.SLOTS
        and _looks_like_a_file(args.args[0])
    ):
        raise UsageError(
            f"explain {args.args[0]}: which slot? explain takes [LOCK] SLOT",
            fix=f"name the slot after the lock: kernel-probe explain {args.args[0]} SLOT "
            f"({', '.join(kernel_lock.SLOTS)})",
        )
    args.lock, args.slot = args.args if len(args.args) == 2 else [default_lock_path(), args.args[0]]
    # before reading the file: a typo is the argument's fault, not the lock's
    slot_argument(args.slot)
    lock = load_lock(args.lock, check_targets=False)
    slot = lock.slots.get(args.slot)
    if args.json:
        output.print_json(
            slot.to_dict()
            if slot
            else {"implementation": None, "note": "not pinned: resolves to torch.nn"}
        )
        return 0
    con = output.console()
    if slot is None:
        con.print(
            f"{safe(args.slot)} is not pinned in {safe(args.lock)}: it resolves to torch.nn "
            "(the default)"
        )
        return 0
    con.print(f"[bold]{args.slot}[/] -> {safe(slot.implementation)} ({safe(slot.target)})")
    con.print(f"  why: {safe(slot.reason or 'no reason recorded')}")
    con.print(
        f"  kwargs: {safe(dict(slot.kwargs))}; requires: "
        f"{safe(', '.join(f'{r.name}{r.specifier}' for r in slot.requires) or 'torch only')}"
    )
    if slot.twin:
        twin = slot.twin
        con.print(
            f"  twin for inference: {safe(twin.target)} {safe(dict(twin.kwargs))}, state dict "
            f"{twin.state_dict}"
            + (f" ({safe(', '.join(twin.migration))})" if twin.migration else "")
            + (f", verified max error {twin.max_error}" if twin.max_error is not None else "")
        )
    else:
        con.print("  no portable twin: inference needs the same library")
    if slot.evidence:
        ev = output.table("correctness evidence")
        for col in ("device", "dtype", "regime", "status", "error/tol"):
            ev.add_column(col, no_wrap=True)
        ev.add_column("failed")
        for e in slot.evidence:
            ev.add_row(
                *(
                    safe(e.get(k, ""))
                    for k in ("device", "dtype", "regime", "status", "worst-error-ratio")
                ),
                safe(", ".join(map(str, e.get("failed", [])))),
            )
        output.print_table(ev)
        con.print("  error/tol: the worst error over the tolerance (< 1 passes)")
    if slot.timing:
        tt = output.table("timings (forward + backward)")
        on_gpu = any("copy-percent" in t for t in slot.timing)  # measured on GPUs only
        cols = ("implementation", "shape", "dtype", "ms", "first call s") + (
            ("GB/s", "% copy") if on_gpu else ()
        )
        for col in cols:
            tt.add_column(
                col,
                no_wrap=True,
                justify="left" if col in ("implementation", "shape", "dtype") else "right",
            )
        for t in slot.timing:
            dtype = f"{short_dtype(t.get('dtype', ''))} {t.get('regime', '')}"
            ms = t.get("median-ms")
            cells = [
                t.get("implementation", ""),
                t.get("shape", ""),
                dtype,
                f"{ms:.3f}" if isinstance(ms, (int, float)) else t.get("error", ""),
                _fmt(t.get("compile-s")),
            ]
            if on_gpu:
                cells += [_fmt(t.get("gbps")), _fmt(t.get("copy-percent"), ".0f")]
            tt.add_row(*(safe(c) for c in cells))
        output.print_table(tt)
        for t in slot.timing:
            if "error" in t:
                con.print(
                    f"  {safe(t.get('implementation', ''))} at {safe(t.get('shape', ''))}: "
                    f"{safe(t['error'])}"
                )
        for line in bar_chart(slot.timing, chosen=slot.implementation):
            con.print(safe(line), soft_wrap=False)
    for r in slot.rejected:
        con.print(
            f"  not chosen: {safe(r.implementation)} {safe(f'[{r.status}]')} "
            f"{safe('; '.join(r.reasons))}"
        )
    return 0


def bar_chart(rows: Any, *, chosen: str = "", width: int = 80) -> list[str]:
    """The candidates' median times as text bars, one group per shape and precision, each bar scaled
    to the slowest there; the chosen one is marked ``*``. Fits ``width`` columns (plain text: logs
    keep it)."""
    groups: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for t in rows:
        ms = t.get("median-ms")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
            key = (
                str(t.get("shape", "")),
                f"{short_dtype(t.get('dtype', ''))} {t.get('regime', '')}".strip(),
            )
            groups.setdefault(key, []).append((str(t.get("implementation", "")), float(ms)))
    if not groups:
        return []
    name_w = min(32, max(len(name) for rs in groups.values() for name, _ in rs) + 2)
    lines = ["  median ms, forward + backward (* chosen; bars scaled to the slowest per shape)"]
    for (shape, precision), rs in groups.items():
        lines.append(f"  {shape} {precision}")
        slowest = max(ms for _, ms in rs)
        for name, ms in sorted(rs, key=lambda r: r[1]):
            label = (("* " if name == chosen else "  ") + name)[:name_w].ljust(name_w)
            figure = f" {ms:.3g}"
            room = max(1, width - 4 - name_w - 10)
            bar = "#" * max(1, round(room * ms / slowest))
            lines.append(f"    {label}{bar}{figure}")
    return lines


def _fmt(value: Any, spec: str = ".3g") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"
