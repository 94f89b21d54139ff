"""Tables in the documentation that are generated from the code, so they cannot drift from it.

A block between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` is filled by ``BLOCKS[NAME]``
(unknown name, or no end: exit 5); ``python -m kernel_probe.docgen`` rewrites README.md and
docs/*.md, ``--check`` only exits 1 if one is out of date (the test suite runs it)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kernel_lock.errors import ExitCode
from kernel_lock.files import write_file

ROOT = Path(__file__).resolve().parent.parent  # the checkout: README.md and docs/ live there

_BEGIN = re.compile(r"<!-- ([a-z][a-z0-9-]*):begin -->\n")


def exit_code_table() -> str:
    """The code -> meaning table of ``kernel_lock.errors.ExitCode``, which every command follows."""
    cell = {ord("|"): "\\|", ord("\n"): " "}
    rows = "".join(f"| {c.value} | {c.meaning.translate(cell)} |\n" for c in sorted(ExitCode))
    return (
        "<!-- generated from kernel_lock.errors.ExitCode by `python -m kernel_probe.docgen`: edit "
        "it there -->\n| code | meaning |\n|---|---|\n" + rows
    )


BLOCKS: dict[str, Callable[[], str]] = {"exit-codes": exit_code_table}


class DocgenError(Exception):
    """A document's markers are malformed: unknown block name, or a begin without its end."""


def render(text: str, where: str = "<text>") -> str:
    """``text`` with every generated block filled in afresh."""
    out, pos = [], 0
    while (m := _BEGIN.search(text, pos)) is not None:
        name, line = m.group(1), text.count("\n", 0, m.start()) + 1
        if name not in BLOCKS:
            known = ", ".join(BLOCKS)
            raise DocgenError(f"{where}:{line}: unknown generated block {name!r} (known: {known})")
        if (end := text.find(f"<!-- {name}:end -->", m.end())) < 0:
            raise DocgenError(
                f"{where}:{line}: <!-- {name}:begin --> without its <!-- {name}:end -->"
            )
        out += [text[pos : m.end()], BLOCKS[name]()]
        pos = end
    return "".join([*out, text[pos:]])


def documents(root: Path = ROOT) -> list[Path]:
    """The documents that may hold generated blocks: README.md and docs/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def update(root: Path = ROOT, *, write: bool = True) -> list[Path]:
    """The documents whose generated blocks are out of date, rewritten unless ``write`` is false."""
    changed = []
    for p in documents(root):
        text = p.read_text(encoding="utf-8")
        if (new := render(text, str(p))) != text:
            if write:
                write_file(p, new, through_link=True)
            changed.append(p)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the generated parts of README.md and docs/*.md (``--check``: only say whether they
    are current)."""
    parser = argparse.ArgumentParser(
        prog="python -m kernel_probe.docgen",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    check_help = "write nothing; exit 1 if a document is out of date"
    parser.add_argument("--check", action="store_true", help=check_help)
    root_help = "the checkout holding README.md and docs/"
    parser.add_argument("--root", type=Path, default=ROOT, help=root_help)
    args = parser.parse_args(argv)
    try:
        if not documents(args.root):
            raise DocgenError(f"no README.md or docs/*.md under {args.root}")
        changed = update(args.root, write=not args.check)
    except DocgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    stale = "generated tables are out of date (run `python -m kernel_probe.docgen`)"
    for p in changed:
        print(
            f"{p}: {stale}" if args.check else f"updated {p}",
            file=sys.stderr if args.check else sys.stdout,
        )
    return ExitCode.FAILURE if (changed and args.check) else ExitCode.OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
