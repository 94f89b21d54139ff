"""The ``kernel-probe`` command line.

``kernel-probe [options]`` runs the probe (detect, check, time, choose, write the lock);
``kernel-probe SUBCOMMAND ...`` runs one of the tools below. Every user error becomes one message on
stderr and a documented exit code (kernel_lock.errors.ExitCode); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from kernel_lock.errors import ExitCode, LockError, LockWarning
from kernel_probe import __version__, output


@dataclass(frozen=True)
class Subcommand:
    """One ``kernel-probe NAME``: its module under kernel_probe.commands (imported only when that
    subcommand runs, so ``kernel-probe --version`` stays fast), the functions that add its arguments
    and run it (spelled out, so grep finds every wiring), its one-line help, and what its ``--json``
    prints (None: it has no --json). ``--debug`` and ``--json`` come from kernel_probe.output's
    parent parsers."""

    module: str
    add_arguments: str
    run: str
    help: str
    json: str | None = None
    # its own process ends without the interpreter's teardown (``exit_now``): with torch loaded that
    # teardown costs 0.3-0.5 s and changes nothing the command reports (issue 37: a first ``env`` <
    # 3 s)
    exit_now: bool = False


SUBCOMMANDS: dict[str, Subcommand] = {
    "verify": Subcommand(
        "verify",
        "add_verify_arguments",
        "run_verify",
        "check this machine against a lock and resolve every slot",
        json="machine-readable result on stdout",
    ),
    "show": Subcommand(
        "show",
        "add_show_arguments",
        "run_show",
        "print a lock in readable form",
        json="the lock's content as JSON",
    ),
    "rehash": Subcommand(
        "rehash",
        "add_rehash_arguments",
        "run_rehash",
        "accept hand edits: recompute a lock's digest (atomic rewrite)",
    ),
    "env": Subcommand(
        "env",
        "add_env_arguments",
        "run_env",
        "report this machine: host, torch build, accelerators, triton, kernel libraries, site",
        json="the report as JSON (keys documented in docs/env.md)",
        exit_now=True,
    ),
    "check": Subcommand(
        "check",
        "add_check_arguments",
        "run_check",
        "run the correctness kernels and print the verdict table",
        json="machine-readable verdicts on stdout",
    ),
    "profiles": Subcommand(
        "profiles",
        "add_profiles_arguments",
        "run_profiles",
        "site profiles: list, show NAME, check PATH, match [NAME] [--node FILE]",
    ),
    "explain": Subcommand(
        "explain",
        "add_explain_arguments",
        "run_explain",
        "why a lock chose what it chose for one slot: evidence, timings, rejections",
        json="the slot's entry as JSON",
    ),
    "diff": Subcommand(
        "diff",
        "add_diff_arguments",
        "run_diff",
        "what changed between two locks: environment fields and choices",
        json="the differences as JSON",
    ),
    "export": Subcommand(
        "export",
        "add_export_arguments",
        "run_export",
        "print a lock as anemoi-models' layer_kernels YAML block (--format anemoi)",
        json="the mapping as JSON instead of YAML",
    ),
    "check-config": Subcommand(
        "check_config",
        "add_check_config_arguments",
        "run_check_config",
        "check an anemoi config's layer_kernels blocks on this machine (and against a lock)",
        json="findings as JSON",
    ),
    "lock": Subcommand(
        "lock",
        "add_lock_arguments",
        "run_lock",
        "derive a lock for inference on this machine: lock --for inference IN OUT",
        json="machine-readable summary on stdout",
    ),
}

# subcommands that pass what follows `--` on to Hydra (anemoi configs)
TAKES_OVERRIDES = ("check-config", "export")


def _epilog() -> str:
    codes = "\n".join(f"  {code.value}  {code.meaning}" for code in ExitCode)
    return f"exit codes:\n{codes}"


# a subcommand's help names the exit codes once, briefly; the table is in `kernel-probe --help` and
# docs/
SUB_EPILOG = (
    "exit codes: 0 ok, 2 usage, 3 mismatch or stale, 5 bad input file; all of them: "
    "kernel-probe --help"
)


def unknown_subcommand(word: str) -> str | None:
    """The message for ``kernel-probe WORD`` where WORD is no subcommand (None: WORD is an option),
    with the nearest subcommand when there is one (difflib: argparse's own suggest_on_error, Python
    3.14, does not see subcommands dispatched here)."""
    import difflib

    if not word or word.startswith("-"):
        return None
    near = difflib.get_close_matches(word, list(SUBCOMMANDS), n=1, cutoff=0.6)
    if near:
        return f"unknown subcommand {word!r}; did you mean {near[0]!r}?"
    return (
        f"{word!r} is not a subcommand (subcommands: {', '.join(SUBCOMMANDS)}); the probe "
        "itself takes only options"
    )


class _Parser(argparse.ArgumentParser):
    """argparse, except that with --json a usage error is also a JSON object on stdout (exit 2)."""

    json_wanted = False
    on_error: Callable[[str], None] | None = (
        None  # the main probe: rank 0's bad argument fails the whole job
    )

    def error(self, message: str) -> NoReturn:
        if self.on_error is not None:
            self.on_error(message)
        if self.json_wanted:
            output.print_json(error_json(message, ExitCode.USAGE, kind="UsageError"))
        super().error(message)


def error_json(
    problem: str,
    exit_code: int,
    *,
    kind: str,
    path: str | None = None,
    key: str | None = None,
    fix: str | None = None,
) -> dict:
    """What a failed command prints on stdout under --json: one object, the same shape for every
    error (kernel_probe.output.failure)."""
    return output.failure(problem, exit_code, kind=kind, file=path, key=key, fix=fix)


def _base_parser(prog: str, description: str, json: str | None) -> _Parser:
    """A command's parser with the common flags: --debug, and --json (its help ``json``) unless
    ``json`` is None."""
    common = [output.debug_flag(), *([] if json is None else [output.json_flag(json)])]
    # did you mean
    extra: dict[str, Any] = {"suggest_on_error": True} if sys.version_info >= (3, 14) else {}
    return _Parser(
        prog=prog,
        description=description,
        epilog=SUB_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=common,
        **extra,
    )


def build_subparser(name: str) -> tuple[_Parser, Callable]:
    """The parser of subcommand ``name`` and its run function, its module imported only now."""
    import importlib

    sub = SUBCOMMANDS[name]
    module = importlib.import_module(f"kernel_probe.commands.{sub.module}")
    p = _base_parser(f"kernel-probe {name}", sub.help, sub.json)
    getattr(module, sub.add_arguments)(p)
    return p, getattr(module, sub.run)


def exit_now(code: int) -> NoReturn:
    """End this process with ``code`` once what it wrote is out (stdout, stderr, logging), skipping
    the interpreter's teardown: finalising torch's modules costs 0.3-0.5 s of CPU, after the
    answer."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: as the interpreter's own exit would say, 120
            code = code or 120
    os._exit(int(code))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parse, run the subcommand, render its errors; returns the exit code.

    ``argv`` None: this process's own command line (``sys.argv``), which a subcommand marked
    ``exit_now`` ends without the interpreter's teardown; a caller passing ``argv`` gets the code
    back."""
    code = _main(list(sys.argv[1:] if argv is None else argv))
    if (
        argv is None
        and sys.argv[1:2]
        and sys.argv[1] in SUBCOMMANDS
        and SUBCOMMANDS[sys.argv[1]].exit_now
    ):
        exit_now(code)
    return code


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("-V", "--version"):
        print(f"kernel-probe {__version__}")
        return ExitCode.OK
    overrides: list[str] = []
    if argv and argv[0] in SUBCOMMANDS:
        parser, run = build_subparser(argv[0])
        rest = argv[1:]
        # Hydra overrides: everything after `--`, as written
        if argv[0] in TAKES_OVERRIDES and "--" in rest:
            cut = rest.index("--")
            rest, overrides = rest[:cut], rest[cut + 1 :]
    else:
        from kernel_probe.commands import probe

        wrong = unknown_subcommand(argv[0]) if argv else None
        if wrong is not None:
            if "--json" in argv:
                output.print_json(
                    error_json(wrong, ExitCode.USAGE, kind="UsageError", fix="kernel-probe --help")
                )
            output.error(f"{wrong}\n  fix: see kernel-probe --help")
            return ExitCode.USAGE
        parser = _base_parser(
            "kernel-probe",
            "Probe kernels on this machine and write a kernel lock.",
            "machine-readable summary on stdout",
        )
        parser.add_argument(
            "-V", "--version", action="version", version=f"kernel-probe {__version__}"
        )
        probe.add_probe_arguments(parser)
        sub = "\n".join(f"  {n:<14} {s.help}" for n, s in SUBCOMMANDS.items())
        parser.epilog = f"subcommands (kernel-probe SUBCOMMAND --help):\n{sub}\n\n{_epilog()}"
        run, rest = probe.run_probe, argv
        parser.on_error = functools.partial(probe.publish_usage_failure, list(rest))
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
        try:
            return int(run(args) or 0)
        except LockError as exc:
            if args.debug:
                raise
            output.error(str(exc))
            if getattr(args, "json", False):
                output.print_json(
                    error_json(
                        exc.problem,
                        exc.exit_code,
                        kind=type(exc).__name__,
                        path=exc.path,
                        key=exc.key,
                        fix=exc.fix,
                    )
                )
            return exc.exit_code
        except KeyboardInterrupt:
            output.error("interrupted")
            return ExitCode.FAILURE
        except Exception as exc:  # a bug: say so plainly, keep the traceback for --debug
            if args.debug or os.environ.get("KERNEL_PROBE_DEBUG"):
                raise
            output.error(
                f"unexpected {type(exc).__name__}: {exc} (re-run with --debug for the traceback)"
            )
            if getattr(args, "json", False):
                output.print_json(
                    error_json(
                        f"unexpected {type(exc).__name__}: {exc}",
                        ExitCode.FAILURE,
                        kind="bug",
                        fix="re-run with --debug for the traceback",
                    )
                )
            return ExitCode.FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
