"""The ``kernel-probe`` command line: ``kernel-probe [options]`` runs the probe, ``kernel-probe
SUBCOMMAND ...`` one of the tools below; errors map to exit codes (kernel_lock.errors.ExitCode)."""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from kernel_lock.errors import ExitCode, LockError, LockWarning
from kernel_lock.tables import nearest
from kernel_probe import __version__, output


@dataclass(frozen=True)
class Subcommand:
    """One ``kernel-probe NAME``: its module under kernel_probe.commands (imported only when it
    runs, so ``--version`` and the job-start path stay fast), its functions, help and ``--json``
    help. ``exit_now``: its process skips the interpreter's teardown (0.3-0.5 s with torch loaded;
    issue 37: a first ``env`` < 3 s)."""

    module: str
    add_arguments: str
    run: str
    help: str
    json: str | None = None
    exit_now: bool = False


_SUMMARY = "machine-readable summary on stdout"
# each subcommand's help, in the order `kernel-probe --help` lists them
_HELP = {
    "verify": "check this machine against a lock and resolve every slot",
    "show": "print a lock in readable form",
    "rehash": "accept hand edits: recompute a lock's digest (atomic rewrite)",
    "env": "report this machine: host, torch build, accelerators, triton, kernel libraries, site",
    "check": "run the correctness kernels and print the verdict table",
    "profiles": "site profiles: list, show NAME, check PATH, match [NAME] [--node FILE]",
    "explain": "why a lock chose what it chose for one slot: evidence, timings, rejections",
    "diff": "what changed between two locks: environment fields and choices",
    "export": "print a lock as anemoi-models' layer_kernels YAML block (--format anemoi)",
    "check-config": "check an anemoi config's layer_kernels blocks on this machine (and against a "
    "lock)",
    "lock": "derive a lock for inference on this machine: lock --for inference IN OUT",
    "model": "trace a model: every call site of every slot, its semantics, shapes and calls",
    "check-model": "the model as written against the model with a lock applied, over training "
    "steps, eval, no-grad and a state-dict round trip; the step time",
}
_JSON = {  # what a subcommand's --json prints (one not here has no --json)
    "verify": "machine-readable result on stdout",
    "show": "the lock's content as JSON",
    "env": "the report as JSON (keys documented in docs/env.md)",
    "check": "machine-readable verdicts on stdout",
    "explain": "the slot's entry as JSON",
    "diff": "the differences as JSON",
    "export": "the mapping as JSON instead of YAML",
    "check-config": "findings as JSON",
    "lock": _SUMMARY,
    "model": "the trace (spec, traced, digest, sites, unreached) as JSON",
    "check-model": "the verdict, each phase, the first diverging site and the timing as JSON",
}
_MODULES: dict[str, tuple[str, ...]] = {  # the subcommands of a shared module (else their own)
    "locks": ("verify", "show", "rehash", "explain", "diff", "lock"),
    "anemoi": ("export", "check-config"),
    "model": ("check-model",),
}
EXIT_NOW = ("env",)  # see Subcommand.exit_now


def _sub(name: str, help: str) -> Subcommand:
    module = next((m for m, names in _MODULES.items() if name in names), name)
    fn = name.replace("-", "_")
    return Subcommand(
        module, f"add_{fn}_arguments", f"run_{fn}", help, _JSON.get(name), name in EXIT_NOW
    )


SUBCOMMANDS: dict[str, Subcommand] = {name: _sub(name, help) for name, help in _HELP.items()}
TAKES_OVERRIDES = ("check-config", "export")  # what follows `--` goes on to Hydra
# a subcommand's help names the exit codes once, briefly; the table is in `kernel-probe --help`
SUB_EPILOG = (
    "exit codes: 0 ok, 2 usage, 3 mismatch or stale, 5 bad input file; all of them: "
    "kernel-probe --help"
)


def unknown_subcommand(word: str) -> tuple[str, str] | None:
    """The problem and fix for ``kernel-probe WORD``, WORD no subcommand (None: WORD is an
    option)."""
    if not word or word.startswith("-"):
        return None
    near = nearest(word, SUBCOMMANDS)
    if near:
        return f"unknown subcommand {word!r}", f"did you mean {near!r}? see kernel-probe --help"
    return (
        f"{word!r} is not a subcommand (subcommands: {', '.join(SUBCOMMANDS)}); the probe "
        "itself takes only options",
        "see kernel-probe --help",
    )


class _Parser(argparse.ArgumentParser):
    """argparse, except that no option is taken for its abbreviation (``allow_abbrev=False``:
    ``--shap`` is not ``--shape``), and that a usage error is one message and a fix naming the
    nearest option or choice, case-insensitively, instead of the whole usage; with --json it is also
    a JSON object on stdout (exit 2)."""

    json_wanted = False
    on_error: Callable[[str], None] | None = None  # the probe: rank 0's bad argument fails the job
    near_miss: str | None = None  # the fix for the choice _check_value refused

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            near = nearest(value, action.choices)
            self.near_miss = f"did you mean {near!r}?" if near else None
        super()._check_value(action, value)

    def error(self, message: str) -> NoReturn:
        fix = self.near_miss or _misspelt_options(message, self) or f"see {self.prog} --help"
        if self.on_error is not None:
            self.on_error(message)
        self.exit(_usage_failure(message, fix, self.json_wanted))


def _usage_failure(problem: str, fix: str, json: bool) -> int:
    """A usage error on stderr, and as ``--json``'s failure on stdout with ``json``; exit 2."""
    if json:
        output.print_json(output.failure(problem, ExitCode.USAGE, kind="UsageError", fix=fix))
    output.error(f"{problem}\n  fix: {fix}")
    return ExitCode.USAGE


def _misspelt_options(message: str, parser: argparse.ArgumentParser) -> str | None:
    """For argparse's "unrecognized arguments: ...", the option each misspells, if any is near."""
    said = "unrecognized arguments: "
    if not message.startswith(said):
        return None
    known = _option_strings(parser)
    words = [w.partition("=")[0] for w in message[len(said) :].split() if w.startswith("-")]
    hints = [f"{w}: did you mean {near!r}?" for w in words if (near := nearest(w, known))]
    return "; ".join(hints) or None


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option ``parser`` and its subcommands' parsers take."""
    out: list[str] = []
    for action in parser._actions:
        out += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            out += [o for sub in action.choices.values() for o in _option_strings(sub)]
    return out


def _base_parser(prog: str, description: str, json: str | None) -> _Parser:
    """A command's parser with --debug, and --json (its help ``json``) unless ``json`` is None."""
    common = [output.debug_flag(), *([] if json is None else [output.json_flag(json)])]
    return _Parser(
        prog=prog,
        description=description,
        epilog=SUB_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=common,
        allow_abbrev=False,
    )


def build_subparser(name: str) -> tuple[_Parser, Callable]:
    """The parser of subcommand ``name`` and its run function (its module imported now)."""
    sub = SUBCOMMANDS[name]
    module = importlib.import_module(f"kernel_probe.commands.{sub.module}")
    p = _base_parser(f"kernel-probe {name}", sub.help, sub.json)
    getattr(module, sub.add_arguments)(p)
    return p, getattr(module, sub.run)


def _probe_parser(argv: list[str]) -> tuple[_Parser, Callable]:
    from kernel_probe.commands import probe  # the probe's modules: a subcommand does not pay them

    description = "Probe kernels on this machine and write a kernel lock."
    parser = _base_parser("kernel-probe", description, _SUMMARY)
    parser.add_argument("-V", "--version", action="version", version=f"kernel-probe {__version__}")
    probe.add_probe_arguments(parser)
    subs = "\n".join(f"  {n:<14} {s.help}" for n, s in SUBCOMMANDS.items())
    codes = "\n".join(f"  {code.value}  {code.meaning}" for code in ExitCode)
    parser.epilog = f"subcommands (kernel-probe SUBCOMMAND --help):\n{subs}\n\nexit codes:\n{codes}"
    parser.on_error = functools.partial(probe.publish_usage_failure, list(argv))
    return parser, probe.run_probe


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` once its output is out, without the interpreter's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: as the interpreter's own exit would say, 120
            code = code or 120
    os._exit(int(code))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parse, run, render errors; the exit code. ``argv`` None: this process's
    own, which a subcommand marked ``exit_now`` ends without the interpreter's teardown."""
    code = _main(list(sys.argv[1:] if argv is None else argv))
    if argv is None and sys.argv[1:2] and getattr(SUBCOMMANDS.get(sys.argv[1]), "exit_now", False):
        exit_now(code)
    return code


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("-V", "--version"):
        print(f"kernel-probe {__version__}")
        return ExitCode.OK
    rest, overrides = argv, []
    if argv and argv[0] in SUBCOMMANDS:
        (parser, run), rest = build_subparser(argv[0]), argv[1:]
        if argv[0] in TAKES_OVERRIDES and "--" in rest:  # Hydra overrides, as written
            cut = rest.index("--")
            rest, overrides = rest[:cut], rest[cut + 1 :]
    elif (wrong := unknown_subcommand(argv[0]) if argv else None) is not None:
        return _usage_failure(*wrong, "--json" in argv)
    else:
        parser, run = _probe_parser(argv)
    parser.json_wanted = "--json" in rest
    args = parser.parse_args(rest)  # exits 2 on usage errors
    args.overrides = overrides
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    output.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LockWarning)  # commands report lock warnings themselves
        return _run(run, args)


def _run(run: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a command and render its failure; ``--debug`` adds the traceback on stderr and changes
    nothing else: not stdout, not the exit code, not what is written."""
    json = getattr(args, "json", False)
    try:
        return int(run(args) or 0)
    except LockError as exc:
        _traceback(args)
        output.error(str(exc))
        if json:
            output.print_json(output.with_failure({}, exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _traceback(args)
        output.error("interrupted")
        return ExitCode.FAILURE
    except Exception as exc:  # a bug: say so plainly, the traceback with --debug
        _traceback(args)
        fix = "re-run with --debug for the traceback"
        problem = f"unexpected {type(exc).__name__}: {exc}"
        output.error(f"{problem} ({fix})")
        if json:
            output.print_json(output.failure(problem, ExitCode.FAILURE, kind="bug", fix=fix))
        return ExitCode.FAILURE


def _traceback(args: argparse.Namespace) -> None:
    """With --debug, the traceback of the exception being handled, on stderr."""
    if args.debug:
        import traceback

        traceback.print_exc(file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
