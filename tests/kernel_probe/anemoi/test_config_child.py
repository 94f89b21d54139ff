"""check-config runs anemoi-training's schema and a config's entries in one child
(``kernel_probe.anemoi.children.check``), and each part alone where that child fails: the same
findings either way, one child fewer when it works."""

from __future__ import annotations

import importlib.resources
import importlib.util
import resource
from pathlib import Path

import pytest

from kernel_probe.anemoi import checks as schema_check
from kernel_probe.anemoi import children as config_child
from kernel_probe.anemoi import entries as entry_checks
from kernel_probe.anemoi import pipelines
from kernel_probe.anemoi.checks import SchemaRun
from kernel_probe.anemoi.config import Config
from kernel_probe.isolation.child import ChildResult
from kernel_probe.isolation.protocol import (
    ConfigCheckReply,
    ConfigCheckRequest,
    EntryCheckReply,
    EntryCheckRequest,
    ProtocolError,
    SchemaReply,
    SchemaRequest,
)

ENTRY = EntryCheckRequest(
    key="LayerNorm", entry={"_target_": "torch.nn.LayerNorm"}, where="model.layer_kernels.LayerNorm"
)
RUN = SchemaRun(SchemaRequest(tree={"model": {}}), "the composed config", "", False)
SCHEMA = SchemaReply(
    errors=[{"where": "model.x", "type": "extra_forbidden", "message": "Extra inputs"}],
    version="0.17.1",
)
ENTRY_REPLY = EntryCheckReply(
    findings=[
        {
            "severity": "note",
            "kind": "entry",
            "where": "model.layer_kernels.LayerNorm",
            "problem": "fine",
            "fix": "",
        }
    ],
    facts={"target": "torch.nn.LayerNorm", "imported": True, "family": "layer_norm"},
)


class Children:
    """Stands in for ``run_function`` in the three modules that start these children: records
    which child was asked, and answers each with what ``answers`` holds for it."""

    def __init__(self, answers: dict[str, ChildResult]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, module, function, payload, *, timeout):
        name = f"{module}.{function}"
        self.asked.append(name)
        if hasattr(payload, "to_json"):
            payload = payload.to_json()
        if name == "kernel_probe.anemoi.children.check":
            for one in payload:  # what the child would read
                ConfigCheckRequest.from_json(one)
        return self.answers[name]


@pytest.fixture
def children(monkeypatch):
    def install(**answers: ChildResult) -> Children:
        fake = Children({k.replace("__", "."): v for k, v in answers.items()})
        for module in (pipelines, schema_check, entry_checks):
            monkeypatch.setattr(module, "run_function", fake)
        return fake

    return install


ALONE = {
    "kernel_probe__anemoi__children__validate": ChildResult("ok", value=SCHEMA.to_json()),
    "kernel_probe__anemoi__entries__check_entries": ChildResult(
        "ok", value=[ENTRY_REPLY.to_json()]
    ),
}


def reading(run=RUN, requests=(ENTRY,), config=None) -> pipelines._Reading:
    """What check_config has read of one config before its children answer."""
    config = config or Config(path="c.yaml", tree={"model": {}})
    return pipelines._Reading(config, [], run, 0, {}, [], {}, list(requests))


def _both():
    [answer] = pipelines._schema_and_entries([reading()], timeout=60)
    return answer


def test_both_parts_in_one_child_when_it_answers(children):
    reply = ConfigCheckReply(schema=SCHEMA, entries=(ENTRY_REPLY,))
    fake = children(
        kernel_probe__anemoi__children__check=ChildResult("ok", value=[reply.to_json()])
    )
    status, errors, entries = _both()
    assert fake.asked == ["kernel_probe.anemoi.children.check"]
    assert status == "checked with anemoi-training 0.17.1's BaseSchema (the composed config)"
    assert [(e.kind, e.where) for e in errors] == [("schema", "model.x")]
    assert entries == [ENTRY_REPLY]


@pytest.mark.parametrize(
    "failed",
    [
        ChildResult("crashed", reason="killed by SIGSEGV"),
        ChildResult("timeout", reason="took over 60 s"),
        ChildResult("error", reason="MemoryError"),
        ChildResult("ok", value=[{"schema": None, "entries": "not a list"}]),  # not its answer
        ChildResult("ok", value=[ConfigCheckReply(schema=SCHEMA).to_json()]),  # an entry short
        ChildResult("ok", value=[]),  # a config short
        ChildResult("ok", value=[ConfigCheckReply(entries=(ENTRY_REPLY,)).to_json()]),  # no schema
    ],
    ids=["crashed", "timeout", "raised", "malformed", "short", "no-config", "no-schema"],
)
def test_each_part_alone_where_the_one_child_fails(children, failed):
    fake = children(kernel_probe__anemoi__children__check=failed, **ALONE)
    status, errors, entries = _both()
    assert fake.asked == [
        "kernel_probe.anemoi.children.check",
        "kernel_probe.anemoi.children.validate",
        "kernel_probe.anemoi.entries.check_entries",
    ]
    assert [(e.kind, e.where) for e in errors] == [("schema", "model.x")]
    assert status.startswith("checked with anemoi-training 0.17.1") and entries == [ENTRY_REPLY]


def test_a_part_alone_runs_in_its_own_child(children):
    fake = children(**ALONE)
    only_schema = reading(requests=(), config=Config(path="c.yaml", tree={}))
    [(status, errors, entries)] = pipelines._schema_and_entries([only_schema], timeout=60)
    assert fake.asked == ["kernel_probe.anemoi.children.validate"] and entries == []
    no_schema = reading("not run: --no-schema", config=Config(path="c.yaml"))
    [(status, errors, entries)] = pipelines._schema_and_entries([no_schema], timeout=60)
    assert fake.asked[1:] == ["kernel_probe.anemoi.entries.check_entries"]
    assert (status, errors, entries) == ("not run: --no-schema", [], [ENTRY_REPLY])


def test_several_configs_share_one_child_each_getting_its_own_answer(children):
    other = EntryCheckReply(findings=[], facts={"target": "torch.nn.Linear", "imported": True})
    replies = [
        ConfigCheckReply(schema=SCHEMA, entries=(ENTRY_REPLY,)).to_json(),
        ConfigCheckReply(entries=(other, ENTRY_REPLY)).to_json(),  # --no-schema: none asked
    ]
    fake = children(kernel_probe__anemoi__children__check=ChildResult("ok", value=replies))
    both = [reading(), reading("not run: --no-schema", (ENTRY, ENTRY))]
    first, second = pipelines._schema_and_entries(both, timeout=60)
    assert fake.asked == ["kernel_probe.anemoi.children.check"]
    assert first[0].startswith("checked with") and first[2] == [ENTRY_REPLY]
    assert second == ("not run: --no-schema", [], [other, ENTRY_REPLY])


def test_where_the_shared_child_fails_each_config_is_asked_alone(children):
    fake = children(
        kernel_probe__anemoi__children__check=ChildResult("crashed", reason="killed by SIGKILL"),
        **ALONE,
    )
    both = [reading(), reading("not run: --no-schema")]
    first, second = pipelines._schema_and_entries(both, timeout=60)
    assert fake.asked == [
        "kernel_probe.anemoi.children.check",
        "kernel_probe.anemoi.children.validate",
        "kernel_probe.anemoi.entries.check_entries",
        "kernel_probe.anemoi.entries.check_entries",
    ]
    assert first[2] == second[2] == [ENTRY_REPLY] and second[:2] == ("not run: --no-schema", [])


def test_the_messages_round_trip_and_a_bad_entry_is_named():
    request = ConfigCheckRequest(schema=RUN.request, schema_memory=1 << 30, entries=(ENTRY,))
    assert ConfigCheckRequest.from_json(request.to_json()) == request
    reply = ConfigCheckReply(schema=SCHEMA, entries=(ENTRY_REPLY, ENTRY_REPLY))
    assert ConfigCheckReply.from_json(reply.to_json()) == reply
    bad = request.to_json()
    del bad["entries"][0]["where"]
    with pytest.raises(ProtocolError, match=r"ConfigCheckRequest\.entries: \[0\]: .*'where'"):
        ConfigCheckRequest.from_json(bad)


def test_the_schemas_address_space_cap_is_lifted_after_it():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    budget = 1 << 44  # 16 TiB: far above anything this process maps
    mapped = config_child._mapped()
    with config_child._address_space(budget):
        capped, _ = resource.getrlimit(resource.RLIMIT_AS)
        assert mapped + budget <= capped <= config_child._mapped() + budget  # on top of the mapped
        assert hard == resource.RLIM_INFINITY or capped <= hard
    assert resource.getrlimit(resource.RLIMIT_AS) == (soft, hard)
    with config_child._address_space(0):
        assert resource.getrlimit(resource.RLIMIT_AS) == (soft, hard)


# ---- real children ---------------------------------------------------------------------------
@pytest.fixture
def counted(monkeypatch):
    """The children check_config starts, by module and function (the real ones still run)."""
    asked: list[str] = []
    for module in (pipelines, schema_check, entry_checks):
        real = module.run_function

        def run(mod, function, *args, _real=real, **kwargs):
            asked.append(f"{mod}.{function}")
            return _real(mod, function, *args, **kwargs)

        monkeypatch.setattr(module, "run_function", run)
    return asked


@pytest.mark.slow
@pytest.mark.anemoi
def test_a_shipped_preset_gets_the_same_findings_from_one_child_as_from_two(counted, monkeypatch):
    """anemoi-training's transformer preset, checked with the one child and with it failing: the
    schema's capped memory (the real cap of the one child, made small here) ends the one child, and
    each part alone (its own child, the real cap) answers the same, finding for finding."""
    # find_spec of a submodule raises where its parent package is missing (no anemoi at all)
    if (
        importlib.util.find_spec("anemoi") is None
        or importlib.util.find_spec("anemoi.training") is None
    ):
        pytest.skip("anemoi-training is not installed; `bash .ci/anemoi-install` installs it")
    preset = (
        Path(str(importlib.resources.files("anemoi.training") / "config"))
        / "model"
        / "transformer.yaml"
    )
    one = pipelines.check_config(preset)
    assert counted == ["kernel_probe.anemoi.children.check"]
    del counted[:]
    monkeypatch.setattr(pipelines, "COMPOSE_MEMORY", 1 << 20)  # the schema does not import in it
    two = pipelines.check_config(preset)
    assert counted == [
        "kernel_probe.anemoi.children.check",
        "kernel_probe.anemoi.children.validate",
        "kernel_probe.anemoi.entries.check_entries",
    ]
    assert one.schema.startswith("checked with anemoi-training") and one.schema == two.schema
    assert one.findings == two.findings and one.exit_code == two.exit_code == 5
