"""Generated JSON of every shape, fed to the readers of inputs that are not the lock: the job marker
(``jobstart.Marker``), a node description (``profiles match --node``) and a site profile's parser.
Each either reads it or refuses it with a documented exit code naming the file: never a traceback,
never exit 1 (issue 34). Slow (the fast lane does not import hypothesis: conftest.SLOW_MODULES)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_lock import LockError, toml
from kernel_lock.errors import ExitCode
from tests.conftest import run_cli

pytestmark = pytest.mark.slow
DOCUMENTED = {int(c) for c in ExitCode} - {int(ExitCode.FAILURE)}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        ["nvidia", "NVIDIA", "cuda", "failed", "written", "env:X", "file:/x", "kernel-probe-node/1"]
    )
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def graft(doc: Any, data: st.DataObject) -> Any:
    """``doc`` with one value (any depth, or a new key) replaced by generated JSON of any shape."""
    if not isinstance(doc, (dict, list)) or not doc or data.draw(st.integers(0, 3)) == 0:
        return data.draw(json_values)
    if isinstance(doc, dict):
        key = data.draw(st.sampled_from([*doc, "new-key"]))
        return {**doc, key: graft(doc.get(key), data)}
    i = data.draw(st.integers(0, len(doc) - 1))
    return [*doc[:i], graft(doc[i], data), *doc[i + 1 :]]


def refused_well(call) -> None:
    try:
        call()
    except LockError as exc:
        assert int(exc.exit_code) in DOCUMENTED, exc
        assert exc.path, exc


# ---- the job marker ------------------------------------------------------------------------------
MARKER = {
    "outcome": "failed",
    "job": "slurm-77.0-a0",
    "by": "rank 0",
    "host": "h",
    "digest": "",
    "inputs": "",
    "problem": "boom",
    "exit_code": 5,
    "fix": "",
}


@SETTINGS
@given(data=st.data())
def test_the_marker_reader(data):
    from kernel_probe.jobstart import Marker

    doc = graft(MARKER, data) if data.draw(st.booleans()) else data.draw(json_values)
    text = json.dumps(doc)
    try:
        marker = Marker.from_json(text, Path("m.json"))
    except LockError as exc:
        assert int(exc.exit_code) == ExitCode.BAD_INPUT and exc.path == "m.json"
        return
    # the reader refuses with exit 5, never 1; the code a marker *records* is the prober's own
    # exit, and 1 is documented for it (failure_marker: a crash, an interrupted probe)
    assert marker.exit_code in {int(c) for c in ExitCode} and (marker.outcome == "failed") == (
        marker.exit_code != 0
    )


# ---- a node description, through the command that reads it ---------------------------------------
NODE = json.loads(
    (
        Path(__file__).resolve().parents[2] / "kernel_probe/profiles/sites/nodes/alps-gh200.json"
    ).read_text()
)


@SETTINGS
@given(data=st.data())
def test_the_node_reader_and_what_matches_it(data, tmp_path_factory, capsys):
    doc = graft(NODE, data) if data.draw(st.booleans()) else data.draw(json_values)
    p = tmp_path_factory.mktemp("node") / "n.json"
    p.write_text(json.dumps(doc))
    profile = data.draw(st.sampled_from(["frontier", "alps-gh200", "cpu", "auto"]))
    code, out, err = run_cli(["profiles", "match", profile, "--node", p], capsys)
    assert code in DOCUMENTED, (code, err)
    assert "Traceback" not in err and "unexpected" not in err, err


# ---- a site profile's parser ---------------------------------------------------------------------
PROFILE = toml.loads(
    (
        Path(__file__).resolve().parents[2] / "kernel_probe/profiles/sites/alps-gh200.toml"
    ).read_text()
)


def tomlable(value: Any) -> Any:
    """JSON as TOML can hold it: no null, no NaN spelled otherwise, no mixed nesting problems."""
    if isinstance(value, dict):
        return {k: tomlable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [tomlable(v) for v in value if v is not None]
    if isinstance(value, float) and math.isnan(value):
        return 0.5
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return 1
    return value


@SETTINGS
@given(data=st.data())
def test_the_profile_parser(data):
    from kernel_probe.profiles import parse

    doc = tomlable(graft(PROFILE, data))
    if not isinstance(doc, dict):
        return
    try:
        text = toml.dumps(doc)
    except (TypeError, ValueError):
        # not expressible as TOML (e.g. a key TOML cannot spell): not an input a file can carry
        return
    refused_well(lambda: parse(text, "p.toml"))
