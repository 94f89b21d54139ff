"""The messages between the probe and its child processes: each one survives JSON, and a message
that is not what its type declares is a clear error, not a KeyError somewhere else."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields, replace

import pytest

from kernel_probe.candidates import Candidate, default_for
from kernel_probe.isolation import protocol as p
from kernel_probe.isolation import worker
from kernel_probe.probe import handlers

CAND = default_for("LayerNorm")

ROW: p.MeasurementRow = {
    "dtype": "float32",
    "regime": "true",
    "cases": {"random": {"y": [1e-7, 2e-7], p.alt_key("rms_norm"): [0.1, 1e-7]}},
    "flags": {p.FLAG_OUTPUT_DTYPE: "float32 (torch.nn: bfloat16)"},
    "nondeterministic": None,
}

SAMPLES: list[p.Request] = [
    p.PingRequest(),
    p.FingerprintRequest(),
    p.ImportRequest(target="torch.nn.LayerNorm"),
    p.CheckRequest(
        candidate=CAND.to_json(),
        slot="LayerNorm",
        device="cpu",
        dtypes=(("float32", "true"), ("bfloat16", "mixed")),
    ),
    p.CheckRequest(
        candidate=CAND.to_json(),
        slot="LayerNorm",
        device="cpu",
        dtypes=(("float32", "true"),),
        canonical={"eps": 1e-6},
        seed=3,
        hidden=64,
        baseline=CAND.to_json(),
    ),
    p.TryRequest(candidate=CAND.to_json(), slot="LayerNorm", device="cuda"),
    p.TimeRequest(
        candidate=CAND.to_json(),
        slot="LayerNorm",
        device="cpu",
        shapes=("32x16",),
        dtype="float32",
        regime="true",
        options={"reps": 2},
        progress=True,
    ),
    p.GraphAttentionRequest(backend="pyg", device="cpu", dtypes=("float32",)),
]

MESSAGES = [
    p.PingReply(pid=42),
    p.ImportReply(ok=False, kind="import", error="ImportError: no"),
    p.ImportReply(ok=True, seconds=0.5, tampered=("torch.matmul",)),
    p.TryReply(ran=False, error="RuntimeError: no CUDA"),
    p.CheckReply(
        candidate=CAND.id,
        device="cpu",
        rows=[ROW],
        layout={"ok": True},
        init=["weight starts at 0"],
        import_s=0.1,
    ),
    p.CheckReply(
        candidate=CAND.id, device="cpu", phase="import", kind="import", error="ImportError: x"
    ),
    p.TimeReply(
        candidate=CAND.id,
        device="cpu",
        rows=[{"implementation": CAND.id, "shape": "32x16", "median_ms": 0.1}],
    ),
    p.TimingProgressMessage(
        shape="32x16", index=0, of=2, phase="rep", done=1, total=5, seconds=0.25
    ),
    p.ImportCheckRequest("liger_kernel"),
    p.ImportCheckRequest("triton", probe="triton-target"),
    p.ImportCheckReply(
        ok=True,
        seconds=0.2,
        file="/x/__init__.py",
        version="1.0",
        target={"backend": "cuda", "arch": 90},
    ),
    p.ImportCheckReply(ok=False, type="OSError", message="bad .so", where="/x/__init__.py:2"),
    p.ComposeRequest(config_dir="/cfg", config_name="config", overrides=("model=gnn",)),
    p.ComposeReply(
        tree={"model": {}},
        blocks={"model.layer_kernels": {"entries": {}}},
        choices={"model": "gnn"},
        sources=["main: /cfg"],
    ),
    p.EntryCheckRequest(
        key="LayerNorm",
        entry={"_target_": "torch.nn.LayerNorm"},
        where="model.layer_kernels.LayerNorm",
    ),
    p.EntryCheckReply(findings=[], facts={"target": "torch.nn.LayerNorm", "imported": True}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(message):
    wire = json.loads(json.dumps(message.to_json()))
    back = type(message).from_json(wire)
    assert back == message


def _name(request):
    return type(request).__name__


def _required(kind):
    return [f.name for f in fields(kind) if f.default is MISSING and f.default_factory is MISSING]


def test_every_op_has_one_request_class_naming_its_reply():
    assert set(p.REQUESTS) == {r.op for r in SAMPLES}
    for op, kind in p.REQUESTS.items():  # each names its op and its required fields
        assert kind.op == op and issubclass(kind.reply, p.Reply) and kind.__name__
        assert all(isinstance(name, str) for name in _required(kind))
    assert set(handlers.OPS) == set(p.REQUESTS.values())  # and each has its handler


@pytest.mark.parametrize("request_", SAMPLES, ids=_name)
def test_every_request_round_trips_through_json(request_):
    wire = json.loads(json.dumps(request_.to_json()))
    back = worker.read_request(wire)
    assert wire["op"] == request_.op and type(back) is type(request_) and back.to_json() == wire
    for key in ("candidate", "baseline"):  # the candidate as the worker rebuilds it
        assert wire.get(key) is None or Candidate.from_json(wire[key]) == CAND


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_an_unknown_key_is_a_clear_error(message):
    wire = {**message.to_json(), "colour": "blue"}
    with pytest.raises(
        p.ProtocolError, match=rf"{type(message).__name__}: unknown key\(s\) 'colour'"
    ):
        type(message).from_json(wire)


@pytest.mark.parametrize("request_", SAMPLES, ids=_name)
def test_an_unknown_request_key_is_a_clear_error(request_):
    with pytest.raises(p.ProtocolError, match=rf"{_name(request_)}: unknown key\(s\) 'colour'"):
        worker.read_request({**request_.to_json(), "colour": "blue"})


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_a_missing_key_is_a_clear_error(message):
    required = [f for f in fields(message) if f.default is MISSING and f.default_factory is MISSING]
    if not required:
        pytest.skip("every key has a default")
    wire = message.to_json()
    del wire[required[0].name]
    with pytest.raises(
        p.ProtocolError, match=rf"{type(message).__name__}: missing key\(s\) '{required[0].name}'"
    ):
        type(message).from_json(wire)


@pytest.mark.parametrize("request_", [r for r in SAMPLES if _required(type(r))], ids=_name)
def test_a_missing_request_key_is_a_clear_error(request_):
    required = _required(type(request_))
    wire = {k: v for k, v in request_.to_json().items() if k != sorted(required)[0]}
    with pytest.raises(
        p.ProtocolError, match=rf"{_name(request_)}: missing key\(s\) '{sorted(required)[0]}'"
    ):
        worker.read_request(wire)


def test_what_is_not_a_message_is_a_clear_error():
    with pytest.raises(p.ProtocolError, match="PingReply: expected a JSON object, got list"):
        p.PingReply.from_json([1])
    with pytest.raises(p.ProtocolError, match="unknown op 'fly'"):
        worker.read_request({"op": "fly"})
    bad_row = {**p.CheckReply(candidate="c", device="cpu", rows=[ROW]).to_json()}
    bad_row["rows"] = [{**ROW, "flgs": {}}]
    with pytest.raises(
        p.ProtocolError, match=r"CheckReply.rows: rows\[0\]: unknown key\(s\) 'flgs'"
    ):
        p.CheckReply.from_json(bad_row)


def test_measurement_keys_are_declared_once():
    assert p.alt_key("rms_norm").startswith(p.ALT_PREFIX)
    assert {"dtype", "regime", "cases", "flags", "blocks", "twin"} <= p.MEASUREMENT_KEYS


@pytest.mark.slow
def test_the_worker_answers_a_typed_request():
    from kernel_probe.isolation.worker import Worker

    with Worker() as w:
        ping = w.call(p.PingRequest(), 120)
        imported = w.call(p.ImportRequest(target="torch.nn.LayerNorm"), 60)
        missing = w.call(p.ImportRequest(target="no_such_module_here.X"), 60)
        tried = w.call(replace(SAMPLES[5], device="cpu"), 60)
    assert isinstance(ping, p.PingReply) and ping.pid > 0
    assert isinstance(imported, p.ImportReply) and imported.ok and not imported.tampered
    assert not missing.ok and missing.kind == "import" and "no_such_module_here" in missing.error
    assert isinstance(tried, p.TryReply) and tried.ran


@pytest.mark.slow
def test_the_worker_reports_a_malformed_request():
    from kernel_probe.isolation.worker import Worker

    with Worker() as w:
        w.call(p.PingRequest(), 120)
        w._proc.stdin.write(b'{"op": "import", "targt": "x"}\n')
        with pytest.raises(RuntimeError, match=r"ImportRequest: unknown key\(s\) 'targt'"):
            w._read(p.ImportReply, 30)
