"""Every link and every section reference of README.md and docs/*.md resolves (issue 57, point 1):
a relative link names a file that exists and, with ``#anchor``, a heading of that file (GitHub's
anchors); a section named in prose ("see 'Patterns' below", ``checks.md, "GatedMLP"``) is a link,
so that it is followed here too. Before: docs/inference.md sent the reader to a README section
("Inference without the training libraries") that did not exist, and docs/cli.md linked
``README.md#exit-codes``, an anchor the README's "Exit codes (every command)" does not have."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a section named in prose, not linked: `file.md, "Title"`, `README ("Title")`, `"Title" below`
PROSE_REFERENCE = re.compile(
    r'(?:[\w-]+\.md\)?,?\s\(?|README\s\(|see\s)"([^"\n]+)"(?!\]\()|"([^"\n]+)" (?:below|above)'
)


def _prose(text: str) -> str:
    """``text`` without its code blocks and code spans (a link or heading there is not one)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of ``path``'s headings (a repeated one numbered, as GitHub does)."""
    counts: dict[str, int] = {}
    found = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        s = slug(heading)
        counts[s] = counts.get(s, 0) + 1
        found.add(f"{s}-{counts[s] - 1}" if counts[s] > 1 else s)
    return frozenset(found)


def links(doc: Path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text())) if ":" not in t]


def test_the_readmes_first_screen_says_what_the_tool_covers():
    """Its first 32 lines: every slot, the model spec, inference, anemoi, and a lock applied to a
    model (the README's model, tests/models/block.py; tests/test_model_end_to_end.py runs it)."""
    from kernel_lock.slots import SPECS

    screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:32])
    missing = [s for s in SPECS if s not in screen]
    wanted = ("--model SPEC", "inference", "anemoi:CONFIG", "GraphTransformer", "tests/models/")
    missing += [w for w in wanted if w not in screen]
    assert not missing and "kernel_lock.apply(model, kernel_lock.load(" in screen, missing


def test_the_slug_is_githubs():
    assert slug("Exit codes (every command)") == "exit-codes-every-command"
    assert slug("Probing for a model: `--model SPEC`") == "probing-for-a-model---model-spec"
    assert slug("`[slots.<Slot>.blas]`: the BLAS library") == "slotsslotblas-the-blas-library"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(doc):
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor in {path.name}")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_section_named_in_prose_is_a_link(doc):
    named = [m.group(0) for m in PROSE_REFERENCE.finditer(_prose(doc.read_text()))]
    assert not named, (
        f"{doc.relative_to(ROOT)} names sections without linking them (make each a link to "
        f"its anchor, which this test follows): {named}"
    )


def test_the_checks_here_fail_on_what_they_look_for(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text(
        '# Title\n\n[x](a.md#title) [y](a.md#nope) [z](b.md) see "Title" below; '
        '[see "Title"](#title)\n```\n[not](c.md)\n```\n'
    )
    assert links(doc) == ["a.md#title", "a.md#nope", "b.md", "#title"]
    assert "nope" not in anchors(doc) and "title" in anchors(doc)
    assert [m.group(0) for m in PROSE_REFERENCE.finditer(_prose(doc.read_text()))] == [
        'see "Title"'
    ]
