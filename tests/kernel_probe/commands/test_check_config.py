"""kernel-probe check-config: an anemoi config's layer_kernels blocks, on this machine and against a lock."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

import kernel_lock
from kernel_lock.anemoi import layer_kernels
from kernel_probe.anemoi.blocks import find_blocks
from kernel_probe.anemoi.config_file import load_config
from kernel_probe.anemoi.entry_checks import check_entry
from tests.conftest import run_cli as run
from tests.conftest import write_sealed

# the training layout: defined once, inherited by every component
TRAINING = """\
model:
  num_channels: 64
  layer_kernels:
    LayerNorm: {_target_: torch.nn.LayerNorm, eps: 1e-6}
    Linear: {_target_: torch.nn.Linear, bias: false}
    Activation: {_target_: torch.nn.GELU}
  processor:
    _target_: anemoi.models.layers.processor.TransformerProcessor
    layer_kernels: ${model.layer_kernels}
  encoders:
    "0": {mapper: {layer_kernels: "${model.layer_kernels}"}}
  decoders:
    "0": {mapper: {layer_kernels: "${model.layer_kernels}"}}
"""


def write(tmp_path, text: str, name: str = "config.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def findings(tmp_path, capsys, text: str, *extra) -> tuple[int, dict]:
    code, out, err = run(["check-config", write(tmp_path, text), "--json", *extra], capsys)
    data = json.loads(out)
    assert data["exit_code"] == code, err
    return code, data


# ---- locating blocks (no imports) -----------------------------------------------------------------
def test_blocks_of_a_training_config():
    config = find_blocks(__import__("yaml").safe_load(TRAINING))
    assert [(b.where, b.inherits) for b in config.blocks] == [
        ("model.layer_kernels", None),
        ("model.processor.layer_kernels", "model.layer_kernels"),
        ("model.encoders.0.mapper.layer_kernels", "model.layer_kernels"),
        ("model.decoders.0.mapper.layer_kernels", "model.layer_kernels"),
    ]
    assert config.findings == []


def test_blocks_of_a_model_config_file_and_older_layouts(tmp_path):
    # config/model/<name>.yaml: the file *is* the model node, yet references say ${model....}
    p = write(
        tmp_path,
        """\
        num_channels: 64
        layer_kernels:
          LayerNorm: {_target_: torch.nn.LayerNorm, eps: 1e-5}
        encoder: {layer_kernels: "${model.layer_kernels}"}
        decoder: {layer_kernels: null}
        processor:
          layer_kernels:
            LayerNorm: "${model.layer_kernels.LayerNorm}"
            Linear: {_target_: torch.nn.Linear, in_features: "${model.num_channels}"}
        noise_injector: {layer_kernels: {Activation: {_target_: torch.nn.SiLU}}}
    """,
    )
    config = find_blocks(load_config(p))
    blocks = {b.where: b for b in config.blocks}
    assert blocks["model.encoder.layer_kernels"].inherits == "model.layer_kernels"
    assert blocks["model.decoder.layer_kernels"].content == {}
    proc = blocks["model.processor.layer_kernels"].content
    # interpolations inside a block are followed; `1e-5` is a float, as OmegaConf reads it
    assert proc["LayerNorm"] == {"_target_": "torch.nn.LayerNorm", "eps": 1e-5}
    assert proc["Linear"]["in_features"] == 64
    assert blocks["model.noise_injector.layer_kernels"].content == {"Activation": {"_target_": "torch.nn.SiLU"}}
    assert [f.problem for f in config.findings] == ["empty: anemoi uses its defaults for every key"]


# ---- judging entries (in-process: the same function the child runs) -------------------------------
ENTRIES = [
    # key, entry, severity, kind, words
    ("Layernorm", {"_target_": "torch.nn.LayerNorm"}, "error", "key", "did you mean 'LayerNorm'"),
    ("querynorm", {"_target_": "torch.nn.LayerNorm"}, "error", "key", "did you mean 'QueryNorm'"),
    ("LayerNorm", {"_target_": "nolib.FastNorm"}, "error", "import", "No module named 'nolib'"),
    ("LayerNorm", {"_target_": "torch.nn.NoSuchNorm"}, "error", "import", "has no attribute 'NoSuchNorm'"),
    ("LayerNorm", {"_target_": "kp_zoo.missing_dependency.X"}, "error", "import", "does not import here"),
    ("LayerNorm", {"eps": 1e-5}, "error", "entry", "no _target_"),
    ("LayerNorm", "torch.nn.LayerNorm", "error", "entry", "expected a mapping"),
    (
        "LayerNorm",
        {"_target_": "kp_zoo.norms.HiddenSizeLayerNorm"},
        "error",
        "signature",
        "LayerNorm(normalized_shape=C) fails: missing a required argument: 'hidden_size'",
    ),
    (
        "QueryNorm",
        {"_target_": "torch.nn.LayerNorm", "unknown_kw": 1},
        "error",
        "signature",
        "QueryNorm(head_dim) fails",
    ),
    (
        "Linear",
        {"_target_": "kp_zoo.norms.GoodLinear", "init": "xavier"},
        "error",
        "signature",
        "Linear(in, out) fails",
    ),
    (
        "Activation",
        {"_target_": "torch.nn.GELU", "approximate": "tanh", "dim": 3},
        "error",
        "signature",
        "Activation() fails",
    ),
    (
        "LayerNorm",
        {"_target_": "torch.nn.RMSNorm", "eps": 1e-6},
        "error",
        "semantics",
        "RMSNorm under the LayerNorm key",
    ),
    ("KeyNorm", {"_target_": "kp_zoo.norms.GoodRMSNorm"}, "error", "semantics", "RMSNorm under the KeyNorm key"),
    ("Linear", {"_target_": "torch.nn.LayerNorm"}, "error", "semantics", "a norm (layer_norm) under the Linear key"),
    ("Activation", {"_target_": "torch.nn.GLU"}, "error", "semantics", "GLU-family"),
    (
        "LayerNorm",
        {"_target_": "torch.nn.LayerNorm", "normalized_shape": 64},
        "warning",
        "dimension",
        "multiple values",
    ),
    ("LayerNorm", {"_target_": "torch.nn.LayerNorm", "_args_": [64]}, "warning", "entry", "_args_"),
]


@pytest.mark.parametrize(
    "key,entry,severity,kind,words", ENTRIES, ids=[f"{e[0]}-{e[3]}-{i}" for i, e in enumerate(ENTRIES)]
)
def test_entry_findings(key, entry, severity, kind, words):
    found, _ = check_entry(key, entry, f"model.layer_kernels.{key}")
    hits = [f for f in found if f.kind == kind]
    assert hits, found
    assert hits[0].severity == severity and hits[0].where == f"model.layer_kernels.{key}"
    assert words in f"{hits[0].problem} fix: {hits[0].fix}"


@pytest.mark.parametrize(
    "key,entry",
    [
        ("LayerNorm", {"_target_": "torch.nn.LayerNorm", "eps": 1e-5, "bias": False}),
        ("LayerNorm", {"_target_": "kp_zoo.norms.GoodLayerNorm", "_partial_": True}),
        ("LayerNorm", {"_target_": "kernel_lock.adapters.CompiledLayerNorm"}),
        ("QueryNorm", {"_target_": "torch.nn.LayerNorm", "bias": False}),
        ("Linear", {"_target_": "torch.nn.Linear", "bias": False}),
        ("Linear", {"_target_": "kp_zoo.norms.GoodLinear"}),
        ("Activation", {"_target_": "torch.nn.SiLU"}),
    ],
)
def test_entries_that_fit(key, entry):
    found, facts = check_entry(key, entry, "x")
    assert found == [] and facts["imported"]


def test_semantics_change_can_be_declared_deliberate():
    found, facts = check_entry("LayerNorm", {"_target_": "torch.nn.RMSNorm"}, "x", allow_semantics_change=True)
    assert [(f.severity, f.kind) for f in found] == [("warning", "semantics")] and facts["family"] == "rms_norm"


# ---- the command ------------------------------------------------------------------------------------
@pytest.fixture
def minimal_lock_path(tmp_path):
    return write_sealed(tmp_path / "kernel-lock.toml")


@pytest.mark.slow
def test_exported_block_passes_against_its_lock(tmp_path, capsys, minimal_lock_path):
    code, out, err = run(["export", minimal_lock_path], capsys)
    assert code == 0, err
    model = "model:\n" + textwrap.indent(out, "  ") + "  processor: {layer_kernels: '${model.layer_kernels}'}\n"
    code, out, err = run(["check-config", write(tmp_path, model), "--lock", minimal_lock_path], capsys)
    assert code == 0, out + err
    assert "model.processor.layer_kernels: inherits model.layer_kernels" in out and "0 error(s)" in out
    # the training layout, whose block agrees with the lock, passes too
    code, data = findings(tmp_path, capsys, TRAINING, "--lock", minimal_lock_path)
    assert (
        code == 0 and data["findings"] == [] and data["expected"] == layer_kernels(kernel_lock.load(minimal_lock_path))
    )


@pytest.mark.slow
def test_disagreements_with_the_lock_exit_3(tmp_path, capsys, minimal_lock_path):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels:
            LayerNorm: {_target_: kp_zoo.norms.GoodLayerNorm, eps: 1e-6}
            Linear: {_target_: torch.nn.Linear}
          processor:
            layer_kernels:
              LayerNorm: {_target_: torch.nn.LayerNorm}
              Linear: {_target_: torch.nn.Linear, bias: false}
    """,
        "--lock",
        minimal_lock_path,
    )
    problems = {(f["where"], f["problem"]) for f in data["findings"] if f["kind"] == "lock"}
    assert code == 3 and {f["severity"] for f in data["findings"]} == {"error"}
    assert problems == {
        ("model.layer_kernels.LayerNorm", "builds kp_zoo.norms.GoodLayerNorm, the lock pins torch.nn.LayerNorm"),
        ("model.layer_kernels.Linear.bias", "bias is not set (default True), the lock pins False"),
        ("model.processor.layer_kernels.LayerNorm.eps", "eps is not set (default 1e-05), the lock pins 1e-06"),
    }


@pytest.mark.slow
def test_config_errors_exit_5_and_win_over_lock_disagreements(tmp_path, capsys, minimal_lock_path):
    code, out, err = run(
        [
            "check-config",
            write(
                tmp_path,
                """\
        model:
          layer_kernels:
            Layernorm: {_target_: torch.nn.LayerNorm}
            LayerNorm: {_target_: torch.nn.RMSNorm, eps: 1e-6}
            Linear: {_target_: nolib.FastLinear}
    """,
            ),
            "--lock",
            minimal_lock_path,
        ],
        capsys,
    )
    assert code == 5, err
    for words in (
        "unknown key 'Layernorm'",
        "did you mean 'LayerNorm'",
        "semantics change",
        "No module named 'nolib'",
        "builds nolib.FastLinear, the lock pins torch.nn.Linear",
        "fix:",
    ):
        assert words in out, words


@pytest.mark.slow
def test_no_block_means_anemoi_defaults(tmp_path, capsys, minimal_lock_path):
    code, data = findings(tmp_path, capsys, "model: {num_channels: 64}\n")
    assert code == 0 and data["findings"][0]["problem"].startswith("no layer_kernels block found")
    code, data = findings(tmp_path, capsys, "model: {num_channels: 64}\n", "--lock", minimal_lock_path)
    assert code == 3  # anemoi's default torch.nn.Linear has a bias; the lock pins bias = false
    assert any(f["where"].startswith("(anemoi defaults).Linear") for f in data["findings"])


@pytest.mark.slow
def test_interpolation_problems(tmp_path, capsys):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels: ${model.kernels}
          processor: {layer_kernels: {LayerNorm: {_target_: torch.nn.LayerNorm, eps: "${oc.env:EPS}x"}}}
    """,
    )
    kinds = {(f["severity"], f["kind"], f["where"]) for f in data["findings"]}
    assert code == 5
    assert ("error", "interpolation", "model.layer_kernels") in kinds
    assert ("warning", "interpolation", "model.processor.layer_kernels.LayerNorm.eps") in kinds


@pytest.mark.slow
def test_a_crashing_import_is_a_finding_not_a_crash(tmp_path, capsys):
    code, data = findings(
        tmp_path,
        capsys,
        """\
        model:
          layer_kernels:
            LayerNorm: {_target_: kp_zoo.abort_on_import.X}
            Linear: {_target_: torch.nn.Linear}
    """,
    )
    [f] = [f for f in data["findings"] if f["severity"] == "error"]
    assert code == 5 and f["kind"] == "import" and "SIGABRT" in f["problem"] and f["where"].endswith(".LayerNorm")


@pytest.mark.parametrize(
    "content,words",
    [
        ("model: [1, 2\n", "not valid YAML at line"),
        ("- just\n- a list\n", "expected a YAML mapping"),
        (None, "cannot read the config"),
    ],
)
def test_unreadable_configs_exit_5(tmp_path, capsys, content, words):
    p = tmp_path / "c.yaml"
    if content is not None:
        p.write_text(content)
    code, _, err = run(["check-config", p], capsys)
    assert code == 5 and words in err and "Traceback" not in err


# ---- YAML bombs, interpolation fan-out, keys that are not names (hostile input, issue 14) ------------------
BOMB = textwrap.dedent("""\
    a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
    model: {layer_kernels: {LayerNorm: {_target_: torch.nn.LayerNorm, junk: *g}}}
""")


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path, capsys):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)
    assert len(BOMB) < 700
    start = time.perf_counter()
    code, _, err = run(["check-config", p], capsys)
    assert code == 5 and "alias bomb" in err and time.perf_counter() - start < 20


def test_an_interpolation_fan_out_is_bounded(tmp_path, capsys):
    levels = ["a0: [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 7):
        levels.append(f"a{i}: [" + ", ".join([f"'${{model.a{i - 1}}}'"] * 10) + "]")
    model = "\n".join("  " + line for line in levels)
    p = tmp_path / "fan.yaml"
    p.write_text(
        f"model:\n{model}\n  layer_kernels:\n    LayerNorm: {{_target_: torch.nn.LayerNorm, junk: '${{model.a6}}'}}\n"
    )
    start = time.perf_counter()
    code, _, err = run(["check-config", p], capsys)
    assert code == 5 and "references produces more than" in err and time.perf_counter() - start < 20


def test_config_keys_that_are_not_names(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text(
        "model:\n  layer_kernels:\n    1: {_target_: torch.nn.LayerNorm}\n    null: {_target_: torch.nn.Linear}\n"
    )
    code, out, err = run(["check-config", p], capsys)
    assert code == 5 and "is a int, not a name" in out and "Traceback" not in err
