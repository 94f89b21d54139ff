"""docs/lock-format.md describes every key a real lock carries.

Real locks, not hand-written ones: a plain probe on this CPU machine, a probe under a site profile
that pins candidates with a distribution, a changed initialisation and a state-dict migration (so
the optional keys appear), and the inference lock `kernel-probe lock --for inference` derives from
it. Every key path of their TOML is walked — tables, arrays of tables, inline tables — and looked up
in the document.

"Documented" means: the key, in backticks, is the whole first cell of a table row with a non-empty
last cell (its meaning), in the section whose heading names the key's parent table in TOML header
form (`[slots.<Slot>.twin]`, `[[slots.<Slot>.evidence]]`; the top level is the section "Top level").
Closed sets of names are listed row by row (slots, fingerprint fields), and their tables share one
section through a placeholder (`[slots.<Slot>]`, `[environment.<field>]`); open sets are one
placeholder row (`<distribution>`, `<kwarg>`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping

import pytest

import kernel_lock
from kernel_lock import errors, toml
from kernel_lock.fingerprint import FIELDS
from kernel_lock.lock import KernelLock
from kernel_lock.schema import Slot
from kernel_lock.tables import table_keys
from kernel_probe.cli import main
from tests.conftest import ROOT, small_probe

DOC = ROOT / "docs" / "lock-format.md"

# parent table -> the placeholder its keys share (open sets: the key itself is the placeholder)
OPEN = {
    ("environment", "libraries"): "<distribution>",
    ("slots", "<Slot>", "kwargs"): "<kwarg>",
    ("slots", "<Slot>", "twin", "kwargs"): "<kwarg>",
}
# tables whose keys are an open set (option names, library names, measured options, outputs) that
# the parent's row documents in prose: the table's own key is checked, its keys are not walked
VALUE_TABLES = {
    ("provenance", "options"),
    ("provenance", "libraries"),
    ("provenance", "anemoi-environment"),
    ("slots", "<Slot>", "evidence[]", "capabilities"),
    ("slots", "<Slot>", "evidence[]", "error-ratios"),
}
# parent table -> (placeholder for its children's tables, keys that are not of the set)
LISTED = {("slots",): ("<Slot>", ()), ("environment",): ("<field>", ("libraries",))}

SITE_PROFILE = """\
profile-version = "1"
name = "docsite"
description = "pins a candidate of each kind the optional lock keys come from"

[requires]
device-type = ["cpu"]

[policy]
deterministic = true

[policy.LayerNorm]
pin = "site.gamma_beta_layer_norm"    # parameters gamma/beta: a rename migration to its twin

[policy.RMSNorm]
pin = "site.rms_norm"                 # names a distribution: requires, environment.libraries

[policy.Linear]
pin = "site.normal_init_linear"       # another initialisation, accepted: accepted-changes

[[candidate]]
id = "site.gamma_beta_layer_norm"
slots = ["LayerNorm"]
target = "kp_zoo.norms.GammaBetaLayerNorm"
twin-target = "torch.nn.LayerNorm"

[[candidate]]
id = "site.rms_norm"
slots = ["RMSNorm"]
target = "torch.nn.RMSNorm"
distribution = "torch"
specifier = ">=2.4"
twin-target = "torch.nn.RMSNorm"

[[candidate]]
id = "site.normal_init_linear"
slots = ["Linear"]
target = "kp_zoo.norms.NormalInitLinear"
twin-target = "torch.nn.Linear"
"""


# ---- what the document says ---------------------------------------------------------------------
_TABLE_NAME = re.compile(r"`\[\[?([^`\[\]]+)\]\]?`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _parent(header: str) -> tuple[str, ...]:
    array = header.startswith("[[")
    parts = tuple(header.strip("[]").split("."))
    return parts[:-1] + (parts[-1] + "[]",) if array else parts


def documented(text: str) -> dict[tuple[str, ...], set[str]]:
    """Parent table -> the keys its section documents (see the module docstring)."""
    keys: dict[tuple[str, ...], set[str]] = {}
    parents: list[tuple[str, ...]] = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            continue
        elif line.startswith("#"):
            title = line.lstrip("#").strip()
            parents = (
                [()]
                if title == "Top level"
                else [_parent(m.group(0).strip("`")) for m in _TABLE_NAME.finditer(title)]
            )
        elif parents and line.startswith("|"):
            cells = [c.strip() for c in _CELL_SPLIT.split(line.strip())[1:-1]]
            key = re.fullmatch(r"`([^`]+)`", cells[0]) if cells else None
            if key and cells[-1]:
                for parent in parents:
                    keys.setdefault(parent, set()).add(key.group(1))
    return keys


# ---- what a lock holds --------------------------------------------------------------------------
def key_paths(
    table: Mapping, parent: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str]]:
    """(parent table, key) for every key, names of sets replaced by their placeholders."""
    for key, value in table.items():
        name = OPEN.get(parent, key)
        yield parent, name
        placeholder, exceptions = LISTED.get(parent, (None, ()))
        child = parent + ((placeholder if placeholder and key not in exceptions else name),)
        if isinstance(value, dict):
            if child not in VALUE_TABLES:
                yield from key_paths(value, child)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                yield from key_paths(item, child[:-1] + (child[-1] + "[]",))


def undocumented(lock: Mapping, doc: str) -> list[str]:
    docs = documented(doc)
    missing = {
        ".".join((*parent, key))
        for parent, key in key_paths(lock)
        if key not in docs.get(parent, set())
    }
    return sorted(missing)


# ---- the real locks -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_locks(tmp_path_factory) -> dict[str, dict]:
    d = tmp_path_factory.mktemp("locks")
    (d / "docsite.toml").write_text(SITE_PROFILE)
    plain, site, inference = d / "plain.toml", d / "site.toml", d / "inference.toml"
    assert main(["--out", str(plain), *small_probe(shape="64x64", reps=1, precision=None)]) == 0
    assert (
        main(
            [
                "--out",
                str(site),
                *small_probe(shape="64x64", reps=1, precision=None),
                "--profile",
                str(d / "docsite.toml"),
                "--allow-init-change",
            ]
        )
        == 0
    )
    assert main(["lock", "--for", "inference", str(site), str(inference)]) == 0
    return {p.stem: toml.loads(p.read_text()) for p in (plain, site, inference)}


@pytest.mark.parametrize("name", ["plain", "site", "inference"])
@pytest.mark.slow
def test_every_key_of_a_real_lock_is_documented(real_locks, name):
    assert undocumented(real_locks[name], DOC.read_text()) == []


def test_the_real_locks_carry_the_optional_keys(real_locks):
    """The walk above is only as good as the locks: they must hold the keys written only
    sometimes."""
    seen = {
        ".".join((*parent, key)) for lock in real_locks.values() for parent, key in key_paths(lock)
    }
    for path in (
        "profile.source",
        "provenance.inputs",
        "provenance.deterministic",
        "provenance.derived-for",
        "provenance.source-profile",
        "environment.libraries.<distribution>.value",
        "slots.<Slot>.requires[].module",
        "slots.<Slot>.accepted-changes",
        "slots.<Slot>.twin.migration",
        "slots.<Slot>.twin.kwargs.<kwarg>",
        "slots.<Slot>.evidence[].out-dtype",
        "slots.<Slot>.evidence[].deterministic",
        "slots.<Slot>.timing[].spread",
        "slots.<Slot>.timing[].tflops",
        "slots.<Slot>.rejected[].reasons",
    ):
        assert path in seen, path


def test_regimes_are_what_the_docs_say(real_locks):
    rows = [
        row
        for lock in real_locks.values()
        for slot in lock["slots"].values()
        for row in (*slot.get("evidence", []), *slot.get("timing", []))
    ]
    assert rows and {row["regime"] for row in rows} <= {"true", "mixed"}
    assert {lock["precision"] for lock in real_locks.values()} == {"bf16-mixed"}


# ---- the check itself fails when it should ------------------------------------------------------
def _without_row(doc: str, first_cell: str, section: str) -> str:
    """``doc`` without the row starting with ``first_cell`` in the section whose heading names
    ``section``."""
    heading = re.search(rf"^#+ .*{re.escape(section)}.*$", doc, re.M)
    assert heading is not None, section
    end = re.compile(r"^#", re.M).search(doc, heading.end())
    row = re.compile(rf"^\| {re.escape(first_cell)} \|.*\n", re.M).search(
        doc, heading.end(), end.start() if end else len(doc)
    )
    assert row is not None, (first_cell, section)
    return doc[: row.start()] + doc[row.end() :]


@pytest.mark.parametrize(
    "mutate,path",
    [
        (
            lambda d: _without_row(d, "`spread`", "`[[slots.<Slot>.timing]]`"),
            "slots.<Slot>.timing[].spread",
        ),
        (lambda d: _without_row(d, "`source`", "`[profile]`"), "profile.source"),
        (
            lambda d: _without_row(d, "`regime`", "`[[slots.<Slot>.evidence]]`"),
            "slots.<Slot>.evidence[].regime",
        ),
        (
            lambda d: _without_row(d, "`device-count`", "`[environment]`"),
            "environment.device-count",
        ),
        (lambda d: _without_row(d, "`RMSNorm`", "`[slots]`"), "slots.RMSNorm"),
        (
            lambda d: _without_row(d, "`<distribution>`", "`[environment.libraries]`"),
            "environment.libraries.<distribution>",
        ),
        (
            lambda d: _without_row(d, "`<kwarg>`", "`[slots.<Slot>.kwargs]`"),
            "slots.<Slot>.kwargs.<kwarg>",
        ),
        (
            lambda d: d.replace("### `[slots.<Slot>.twin]`", "### The twin"),
            "slots.<Slot>.twin.max-error",
        ),
        # documented for another table only: the evidence's `deterministic` row does not cover
        # provenance's
        (
            lambda d: _without_row(d, "`deterministic`", "`[provenance]`"),
            "provenance.deterministic",
        ),
    ],
)
def test_a_key_the_document_lost_is_reported(real_locks, mutate, path):
    doc = mutate(DOC.read_text())
    assert doc != DOC.read_text()
    missing = {p for lock in real_locks.values() for p in undocumented(lock, doc)}
    assert path in missing, missing


def test_a_new_key_in_a_lock_is_reported(real_locks):
    lock = copy.deepcopy(real_locks["site"])
    lock["slots"]["Linear"]["timing"][0]["p99-ms"] = 1.0
    lock["slots"]["Linear"]["twin"]["tolerance"] = 0.1
    lock["environment"]["gpu-clock"] = {"value": "1980", "match": "ignore"}
    lock["provenance"]["host"] = "nid001234"
    assert undocumented(lock, DOC.read_text()) == [
        "environment.gpu-clock",
        "provenance.host",
        "slots.<Slot>.timing[].p99-ms",
        "slots.<Slot>.twin.tolerance",
    ]


# ---- keys the code declares, whether or not a CPU probe writes them -----------------------------
def test_every_schema_key_is_documented():
    docs = documented(DOC.read_text())
    assert set(table_keys(KernelLock)) <= docs[()]
    assert set(table_keys(Slot)) <= docs[("slots", "<Slot>")]
    assert set(FIELDS) | {"libraries"} <= docs[("environment",)]
    assert set(kernel_lock.SLOTS) <= docs[("slots",)]


def test_the_complete_example_is_a_lock_with_documented_keys():
    text = DOC.read_text()
    example = re.search(r"## Complete example\n\n```toml\n(.*?)```", text, re.S).group(1)
    lock = kernel_lock.loads(example, emit_warnings=False)
    assert [w for w in lock.warnings if "digest" not in w] == []  # only the illustrative digest
    assert undocumented(toml.loads(example), text) == []
    assert {e["regime"] for s in lock.slots.values() for e in s.evidence} <= {"true", "mixed"}


def test_the_errors_table_gives_each_class_its_exit_code():
    text = DOC.read_text()
    section = text[text.index("## Errors") :]
    rows = re.findall(r"^\| `(\w+)`[^|]* \| (\d) \|", section, re.M)
    assert len(rows) >= 6
    for name, code in rows:
        assert getattr(errors, name).exit_code == int(code), name
