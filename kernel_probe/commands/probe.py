"""The main command: parse the arguments into a ProbeRequest, run the job start and the pipeline
(``kernel_probe.jobstart.run``), render what they say. Errors are left to the CLI's exit codes."""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernel_lock.slots import PRECISIONS
from kernel_probe import jobstart, output
from kernel_probe import slots as slot_behaviour
from kernel_probe.commands.check import add_candidate_arguments, declared_from, status_cell
from kernel_probe.errors import UsageError
from kernel_probe.isolation.protocol import INTERPRETED, TimingProgressMessage
from kernel_probe.output import DEFAULT_LOCK, count, safe, seconds
from kernel_probe.probe.limits import MAX_REPS
from kernel_probe.probe.pipeline import ProbeResult
from kernel_probe.probe.planning import DEFAULT_REPS, DEFAULT_SHAPES, Events, ProbeRequest
from kernel_probe.slots.base import shape_work


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of a probe (``kernel-probe`` with no subcommand)."""
    p.add_argument(
        "--out", default=DEFAULT_LOCK, help=f"where to write the lock (default ./{DEFAULT_LOCK})"
    )
    model = (
        "probe for this model: path/to/file.py:callable or package.module:callable (returning "
        "(model, args[, kwargs])), or anemoi:CONFIG; its trace (run in a child) decides the slots, "
        "their semantics and their shapes, weighted by calls, and the lock records it; --check "
        "with --model is stale (exit 3) for a lock made for another model or other sizes"
    )
    p.add_argument("--model", default="", metavar="SPEC", help=model)
    skip = (
        "with --model: do not run the model-level check of the model with the chosen lock "
        "(by default run after choosing, recorded in the lock's [model.check]; a diverging one "
        "writes no lock, exit 3)"
    )
    output.add_flags(p, {"--no-model-check": skip})
    shape = (
        "model shape to time at: ROWSxHIDDEN, e.g. 40320x1024 (rows: batch x sequence), or "
        "ROWSxINxOUT for a probe of Linear alone; SLOT=SHAPE for one slot's own, e.g. "
        "LayerNorm=8192x1024 or Linear=8192x1024x4096 (repeatable; a three-part shape where a "
        "slot takes ROWSxHIDDEN exits 2). "
        f"Default: {' and '.join(DEFAULT_SHAPES['gpu'])} on GPU, "
        f"{' and '.join(DEFAULT_SHAPES['cpu'])} on CPU"
    )
    p.add_argument("--shape", action="append", default=[], metavar="ROWSxHIDDEN", help=shape)
    precision = "the training precision regime to verify and time in (default: the profile's, "
    precision += "else bf16-mixed)"
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=None, help=precision)
    profile = (
        "apply a site profile: its requirements are enforced (exit 4), its policy applied; "
        "auto picks one from the site signals"
    )
    p.add_argument("--profile", default=None, metavar="NAME|PATH|auto", help=profile)
    dirs = "extra directory of profiles (repeatable; also $KERNEL_PROBE_PROFILES, "
    dirs += "os.pathsep-separated)"
    p.add_argument("--profiles-dir", action="append", default=[], metavar="DIR", help=dirs)
    prefer = "take this candidate if accepted and not slower than the default beyond the noise "
    prefer += "margin"
    p.add_argument("--prefer", action="append", default=[], metavar="SLOT=ID", help=prefer)
    pin = "take this candidate if accepted, whatever its speed"
    p.add_argument("--pin", action="append", default=[], metavar="SLOT=ID", help=pin)
    output.add_flags(p, PROBE_SWITCHES)
    _add_run_arguments(p)


PROBE_SWITCHES = {
    "--force": "probe again even if the lock is current; replace a corrupt lock",
    "--check": "write nothing; exit 0 if the lock is current for this machine, 3 if stale or "
    "missing",
}


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How long, who and what a probe runs."""
    reps = (
        f"timed repetitions per shape (at least; default "
        f"{DEFAULT_REPS['gpu']} on GPU, {DEFAULT_REPS['cpu']} on CPU)"
    )
    p.add_argument("--reps", type=count(1, MAX_REPS), default=None, help=reps)
    wait = "seconds to wait for another kernel-probe writing the same lock (default 1800)"
    p.add_argument("--lock-timeout", type=seconds, default=1800.0, help=wait)
    per = (
        "under a launcher that names each rank (Slurm, torchrun, Open MPI, PMI, PALS): "
        "job (default, or the profile's [policy] probe-per) = rank 0 probes, the others wait for "
        "its lock; node-type = one rank per kind of node, --out must name {node-type}; rank = "
        "ignore the launcher, every rank takes the file lock as without one"
    )
    p.add_argument("--probe-per", choices=("job", "node-type", "rank"), default=None, help=per)
    deterministic = (
        "choose only candidates whose forward and backward are bitwise repeatable (for "
        "training in a deterministic mode); a pin that is not is an error"
    )
    output.add_flags(p, {"--deterministic": deterministic})
    graph = (
        "check anemoi's GraphTransformer attention backends (its Triton kernel, PyG) "
        "against float64 and record graph_attention_backend in the lock: auto = what anemoi would "
        "run here; triton on a machine where anemoi would fall back to pyg is an error unless "
        "--allow-graph-attention-fallback"
    )
    p.add_argument("--graph-attention", choices=("auto", "triton", "pyg"), default="", help=graph)
    fallback = (
        "with --graph-attention triton: record that a job may run where anemoi falls back "
        "to pyg (no GPU or no triton); the job-start check refuses such a machine otherwise"
    )
    output.add_flags(p, {"--allow-graph-attention-fallback": fallback})
    add_candidate_arguments(p)
    # not an option of the probe (it takes --precision): kept hidden to answer helpfully
    p.add_argument("--dtype", action="append", default=[], help=argparse.SUPPRESS)


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for text in values:
        slot, sep, cid = text.partition("=")
        if not sep or not cid:
            raise UsageError(
                f"{flag} {text!r}: expected SLOT=ID, e.g. {flag} RMSNorm=liger.rms_norm"
            )
        out[slot] = cid  # a slot it names is the plan's to know
    return out


def publish_usage_failure(argv: Sequence[str], message: str) -> None:
    """A bad argument argparse refused: rank 0 of a job leaves its failed marker beside ``--out``,
    so the other ranks fail at once instead of waiting out --lock-timeout."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False, allow_abbrev=False)
    pre.add_argument("--out", default=DEFAULT_LOCK)
    pre.add_argument("--probe-per", default=None)
    pre.add_argument("--check", action="store_true")
    try:
        known, _ = pre.parse_known_args(list(argv))
    except (argparse.ArgumentError, SystemExit):
        return
    jobstart.fail_before_plan(known.out, known.probe_per, known.check, UsageError(message))


# the ProbeRequest fields taken as argparse parsed the option of the same name; request_from
# converts the others (a test checks that the two sets fill every field)
AS_PARSED = (
    *("graph_attention", "allow_graph_attention_fallback", "precision", "profile", "reps"),
    *("deterministic", "with_compile", "allow_init_change", "strict_dtype", "allow_approximation"),
    *("timeout", "import_timeout", "force", "lock_timeout", "probe_per", "model"),
)


def request_from(args: argparse.Namespace) -> ProbeRequest:
    """The command line as a typed request (argument errors here are usage errors, exit 2)."""
    if args.dtype:
        raise UsageError(
            "the main probe takes --precision (e.g. bf16-mixed), not --dtype; --dtype is for "
            "`kernel-probe check`"
        )
    return ProbeRequest(
        out=Path(args.out),
        shapes=tuple(args.shape),
        slots=tuple(args.slot),
        pins=_pairs(args.pin, "--pin"),
        prefers=_pairs(args.prefer, "--prefer"),
        candidates=tuple(args.candidate),
        plugins=not args.no_plugins,
        profiles_dirs=tuple(args.profiles_dir),
        check_only=args.check,
        command=("kernel-probe " + shlex.join(sys.argv[1:])).strip(),
        declared=declared_from(args),
        model_check=not args.no_model_check,
        **{name: getattr(args, name) for name in AS_PARSED},
    )


class ConsoleEvents(Events):
    """The pipeline's events on stderr: a progress bar in a terminal, plain lines in a log."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.task: Any = None
        self.timers: dict[tuple[str, str], TimingProgress] = {}

    @functools.cached_property
    def terminal(self) -> bool:
        """Whether stderr is a terminal (a live bar) or a log (one line per step)."""
        return bool(output.console(stderr=True).is_terminal)

    @functools.cached_property
    def progress(self) -> Any:
        """The progress bar, made on first use: a reused lock never imports rich."""
        from rich.progress import Progress  # rich: only where a probe runs

        return Progress(
            *self.progress_columns(),
            console=output.console(stderr=True),
            transient=True,
            disable=self.quiet or not self.terminal,
        )

    @staticmethod
    def progress_columns() -> tuple[Any, ...]:
        """The bar's columns: description, a short bar, done/total, the clock: 80 in all."""
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn  # rich: see above

        return (
            TextColumn("{task.description}"),
            BarColumn(bar_width=10),
            TextColumn("{task.completed:.0f}/{task.total:.0f}"),
            TimeElapsedColumn(),
        )

    def note(self, text: str) -> None:
        """An informational line on stderr."""
        output.info(text)

    def warn(self, text: str) -> None:
        """A warning on stderr."""
        output.warn(text)

    def begin(self, total: int) -> None:
        """Start the progress bar over ``total`` candidate checks."""
        self.progress.start()
        self.task = self.progress.add_task("checking", total=total)

    def checking(self, slot: str, cand_id: str, index: int, total: int) -> None:
        """Candidate ``index`` of ``total`` is being checked: the bar's position, or a log line."""
        what = f"checking {slot}: {cand_id}"
        self.progress.update(self.task, completed=index - 1, total=total, description=what[:52])
        if not self.terminal:  # a batch log: one line per candidate, so a slow one is visible
            output.info(f"{what} ({index}/{total})")

    def timing(
        self, slot: str, cand_id: str, shapes: Sequence[str], message: TimingProgressMessage | None
    ) -> None:
        """A candidate's timing starts (``message`` None) or reports progress at one shape."""
        what = f"timing {slot}: {cand_id}"
        if message is None:
            show = (
                (lambda text: self.progress.update(self.task, description=text))
                if self.terminal
                else output.info
            )
            work = slot_behaviour.slot(slot).work
            self.timers[(slot, cand_id)] = TimingProgress(
                what, list(shapes), show, compact=self.terminal, work=work
            )
            self.progress.update(self.task, description=what[: TimingProgress.WIDTH])
        else:
            self.timers[(slot, cand_id)](message)
            if self.terminal:  # while timing, the bar counts this shape's calls, not the candidates
                self.progress.update(self.task, completed=message.done, total=message.total)

    def done(self) -> None:
        """Stop the progress bar."""
        self.progress.stop()


def run_probe(args: argparse.Namespace) -> int:
    """A probe: the request, the job start and the probe, then the summary or the JSON."""
    try:
        request = request_from(args)
    except UsageError as exc:
        jobstart.fail_before_plan(args.out, args.probe_per, args.check, exc)
        raise
    result = jobstart.run(request, ConsoleEvents(quiet=args.json))
    if result.reused:
        _reused(args, result)
    elif args.json:
        output.print_json(_summary(result))
    else:
        _report(result)
    return 0


def _reused(args: argparse.Namespace, result: ProbeResult) -> None:
    lock, out = result.lock, result.lock_path
    if not args.json:
        choices = ", ".join(f"{n} -> {s.implementation}" for n, s in lock.slots.items())
        by = f"written for this job by {result.source}, " if result.source else ""
        reused = "" if args.check else ", reused without probing"  # --check only looks
        output.info(f"{out}: {by}current for this machine{reused} ({choices})")
        return
    slots = {n: {"chosen": s.implementation, "reason": s.reason} for n, s in lock.slots.items()}
    written_by = {"written-by": result.source} if result.source else {}
    seconds = round(result.seconds, 2)
    output.print_json(
        {"lock": str(out), "reused": True, "seconds": seconds, **written_by, "slots": slots}
    )


class TimingProgress:
    """A timing worker's progress as one line: where it is, how long is left (by the timed
    repetitions). ``compact``: a terminal's line, updated in place; else a log line when a shape
    starts and ends, at most every ``every`` s between. ``work``: a shape's relative cost."""

    WIDTH = 52  # of the description in a terminal: with the bar, the count and the clock, 80

    def __init__(
        self,
        what: str,
        shapes: list[str],
        show: Callable[[str], Any],
        every: float = 10.0,
        *,
        compact: bool = False,
        work: Callable[[str], float] | None = None,
    ):
        self.what, self.shapes, self.show, self.every = what, shapes, show, every
        self.compact, self.work = compact, work or shape_work
        self._last, self._shape = -float("inf"), None  # type: tuple[float, str | None]
        self._reps_from = 0.0  # seconds into the shape when the timed repetitions began

    def __call__(self, msg: TimingProgressMessage) -> None:
        new_shape = msg.shape != self._shape
        if msg.phase != "rep":  # the repetitions begin where the last warm-up call ended
            self._reps_from = msg.seconds
        elif new_shape:
            self._reps_from = 0.0
        now = time.monotonic()
        last_call = msg.phase == "rep" and msg.done == msg.total
        if not (self.compact or new_shape or last_call or now - self._last >= self.every):
            return
        self._shape, self._last = msg.shape, now
        self.show(self.text(msg))

    def per_call(self, msg: TimingProgressMessage) -> float:
        """Seconds per timed repetition so far at this shape (``msg.phase == "rep"``)."""
        return max(0.0, msg.seconds - self._reps_from) / max(1, msg.done)

    def text(self, msg: TimingProgressMessage) -> str:
        """The progress line of one timing message: the shape, the phase, the time left."""
        if self.compact:
            return self.short(msg)
        where = f"{self.what} at {msg.shape} (shape {msg.index + 1}/{msg.of})"
        if msg.phase != "rep":
            return f"{where}: {msg.phase} {msg.done}/{msg.total}, {msg.seconds:.1f} s so far"
        per_call = self.per_call(msg)
        text = f"{where}: rep {msg.done}/{msg.total}, {per_call:.2g} s per call"
        if msg.done < msg.total:
            text += f", about {per_call * (msg.total - msg.done):.0f} s left at this shape"
        later = self.later(msg, per_call)
        if later:
            text += f", about {later:.0f} s for the shapes after it"
        return text

    def later(self, msg: TimingProgressMessage, per_call: float) -> float:
        """The repetitions of the shapes after this one, by their size (warm-up not counted)."""
        after = sum(self.work(s) for s in self.shapes[msg.index + 1 :])
        return per_call * msg.total * after / self.work(msg.shape)

    def short(self, msg: TimingProgressMessage) -> str:
        """The terminal's line (at most WIDTH): candidate, shape i/n, repetition, time left."""
        tail = f" {msg.shape} {msg.index + 1}/{msg.of}"
        if msg.phase != "rep":
            tail += f" {msg.phase}"
        else:
            per_call = self.per_call(msg)
            left = per_call * (msg.total - msg.done) + self.later(msg, per_call)
            tail += f" rep {msg.done}/{msg.total} ~{left:.0f}s left"
        head = self.what.removeprefix("timing ")
        room = self.WIDTH - len(tail)
        if len(head) > room:
            head = head[: max(1, room - 1)] + "…"
        return (head + tail)[: self.WIDTH]


def _summary(result: ProbeResult) -> dict[str, Any]:
    """The probe's ``--json`` answer."""
    plan, timings, model = result.plan, result.timings, result.lock.model
    return {
        "lock": str(result.lock_path),
        "reused": False,
        **({"replaced": result.replaced} if result.replaced else {}),
        "seconds": round(result.seconds, 2),
        "device": plan.device,
        "precision": plan.precision,
        "shapes": list(plan.shapes),
        **({"slot-shapes": own} if (own := plan.inputs.get("slot_shapes")) else {}),
        **({"model": plan.model.to_dict(), "weights": plan.weights} if plan.model else {}),
        **({"model-check": model.check.to_dict()} if model and model.check else {}),
        **{
            s.summary_key: plan.resolved[s.name]
            for s in slot_behaviour.SLOTS.values()
            if s.summary_key
        },
        "check_seconds": round(result.check_seconds, 2),
        "time_seconds": round(result.time_seconds, 2),
        "slots": {
            slot: {
                "chosen": c.report.id,
                "how": c.how,
                "reason": c.reason,
                "candidates": [
                    dict(r.to_json(), timings=timings[slot].get(r.id, []))
                    for r in result.reports[slot]
                ],
            }
            for slot, c in result.choices.items()
        },
    }


def _report(result: ProbeResult) -> None:
    """The probe's summary: per slot a table of candidates and timings, then the choices."""
    plan, con = result.plan, output.console()
    dev = plan.device
    on_gpu = dev["type"] != "cpu"
    shapes_from = f" ({plan.shapes_from})" if plan.shapes_from else ""
    shapes_from += "".join(f", {own}" for own in plan.inputs.get("slot_shapes", ()))
    declared = "".join(
        f", {s.summary_key} {plan.resolved[s.name]}"
        for s in slot_behaviour.SLOTS.values()
        if s.summary_key and s.name in plan.slots
    )
    con.print(
        f"device {dev['type']} ({safe(str(dev['name']))}), precision {plan.precision}, "
        f"shapes {', '.join(plan.shapes)}{shapes_from}{declared}"
    )
    for slot, c in result.choices.items():
        output.print_table(_slot_table(slot, c.report.id, result, on_gpu))
        timings = result.timings[slot]
        for r in result.reports[slot]:
            if r.interpreted:
                con.print(f"  [dim]{safe(r.id)} {safe(INTERPRETED)}[/]")
            if r.status != "accepted" and r.reasons:
                con.print(f"  [dim]{safe(r.id)} {r.status}: {safe(r.reasons[0])}[/]")
            for t in timings.get(r.id) or ():
                if "error" in t:
                    con.print(f"  [dim]{safe(r.id)} at {safe(t['shape'])}: {safe(t['error'])}[/]")
    if not on_gpu:
        con.print(
            "[dim]ms: median forward + backward; bandwidth figures (GB/s, % of a copy) are shown "
            "on GPUs only (on a CPU a copy of a cache-sized buffer is no ceiling)[/]"
        )
    for slot, c in result.choices.items():
        con.print(f"[bold]{slot}[/] -> {safe(c.report.id)} ({safe(c.reason)})")
    con.print(
        f"wrote {safe(str(result.lock_path))} in {result.seconds:.1f} s (check "
        f"{result.check_seconds:.1f} s, timing {result.time_seconds:.1f} s)"
    )


def _slot_table(slot: str, chosen: str, result: ProbeResult, on_gpu: bool) -> Any:
    """One slot's table: each candidate's verdict, and its time at each shape."""
    table = output.table(slot)
    columns = [("candidate", False), ("verdict", False), ("shape", False), ("ms", True)]
    for col, right in columns + ([("GB/s", True), ("% copy", True)] if on_gpu else []):
        table.add_column(col, no_wrap=True, justify="right" if right else "left")
    blank = ["", ""] if on_gpu else []
    for r in result.reports[slot]:
        status = status_cell(r, chosen=r.id == chosen)
        for i, t in enumerate(result.timings[slot].get(r.id) or (None,)):  # untimed: a row of "-"
            cells = ["-", "", *blank]
            if t is not None and "error" in t:
                cells = [t["shape"], "error", *blank]
            elif t is not None:
                cells = [t["shape"], f"{t['median_ms']:.3f}"]
                if on_gpu:
                    copy = f"{t['copy_percent']:.0f}" if "copy_percent" in t else "-"
                    cells += [f"{t['gbps']:.3g}", copy]
            table.add_row(safe(r.id) if i == 0 else "", status if i == 0 else "", *cells)
    return table
