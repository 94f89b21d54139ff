"""The real consumer: anemoi-models 0.19.0 builds its processors from a lock kernel-probe wrote
here.

Each processor is configured the way anemoi-training does it (`model.layer_kernels`, with
`processor.layer_kernels: ${model.layer_kernels}`, built by Hydra with `_recursive_=False`), from
the YAML `kernel-probe export` prints. Forward and backward run on CPU, and every layer anemoi
builds through `layer_kernels` is exactly the class the lock names.

Install (what .ci/run does through .ci/anemoi-install): anemoi-models pins torch<2.11, so it goes in
with --no-deps on the CPU torch, then only its light runtime dependencies; `pip check` complains.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip(
    "anemoi.models.layers.processor",
    reason="anemoi-models (or one of its runtime dependencies) is not installed; `bash "
    ".ci/anemoi-install` installs anemoi-models==0.19.0 with --no-deps on the CPU torch",
)

import torch
from anemoi.models.distributed.shapes import GraphShardInfo
from anemoi.models.layers.normalization import AutocastLayerNorm
from anemoi.models.schemas.processor import TransformerProcessorSchema
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

import kernel_lock
import kernel_lock.adapters as adapters
from kernel_lock import registry
from kernel_lock.anemoi import layer_kernels, locate
from kernel_lock.trust import import_target
from kernel_probe.cli import main
from tests.conftest import small_probe, write_sealed

# the real consumer end to end (anemoi-models, Hydra): slow, and the fast lane does not import it
# (conftest.SLOW_MODULES)
pytestmark = [pytest.mark.anemoi, pytest.mark.slow]

N, C, E, EDGE_DIM, HEADS = 24, 32, 96, 8, 4
# built with a hard-coded torch.nn.Linear inside anemoi 0.19 (MultiHeadSelfAttention's q/k/v): no
# layer_kernels entry reaches them
HARD_CODED_LINEARS = {"lin_q", "lin_k", "lin_v"}

PROCESSORS = {
    "TransformerProcessor": dict(
        num_heads=HEADS,
        mlp_hidden_ratio=2,
        qk_norm=True,
        window_size=None,
        attention_implementation="scaled_dot_product_attention",
        dropout_p=0.0,
        softcap=0.0,
        use_alibi_slopes=False,
    ),
    "GNNProcessor": dict(mlp_extra_layers=0, edge_dim=EDGE_DIM),
    "GraphTransformerProcessor": dict(
        num_heads=HEADS, mlp_hidden_ratio=2, qk_norm=True, edge_dim=EDGE_DIM
    ),
    "PointWiseMLPProcessor": dict(mlp_hidden_ratio=2),  # the positional LayerNorm(C) call site
}


def _probe(path, *extra) -> kernel_lock.KernelLock:
    assert main(["--out", str(path), *extra]) == 0
    return kernel_lock.load(path)


@pytest.fixture(scope="module")
def locks(tmp_path_factory):
    """Two locks kernel-probe writes on this machine: its own choice (`kernel-probe --out
    kernel-lock.toml`, as the README says), and a choice it was told to pin."""
    d = tmp_path_factory.mktemp("anemoi-locks")
    chosen = _probe(d / "kernel-lock.toml")
    assert set(chosen.slots) == {
        "LayerNorm",
        "RMSNorm",
        "Linear",
        "Attention",
        "Activation",
    }  # RMSNorm: never exported
    pinned = _probe(
        d / "pinned.toml",
        *small_probe("LayerNorm", "Linear", shape="256x64"),
        "--candidate",
        "LayerNorm=kp_zoo.norms.GoodLayerNorm",
        "--pin",
        "LayerNorm=custom:kp_zoo.norms.GoodLayerNorm",
        "--candidate",
        "Linear=kp_zoo.norms.GoodLinear",
        "--pin",
        "Linear=custom:kp_zoo.norms.GoodLinear",
    )
    assert pinned.slots["LayerNorm"].target == "kp_zoo.norms.GoodLayerNorm"
    assert pinned.slots["Linear"].target == "kp_zoo.norms.GoodLinear"
    return {"chosen": chosen, "pinned": pinned}


def exported_yaml(lock_path, *extra) -> str:
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["export", str(lock_path), "--format", "anemoi", *extra]) == 0
    return buf.getvalue()


def build(name: str, block_yaml: str) -> torch.nn.Module:
    """The processor as anemoi-training builds it: ``block_yaml`` (a ``layer_kernels:`` block, as
    `kernel-probe export` prints it) under ``model:``, an OmegaConf tree, Hydra,
    `_recursive_=False`."""
    options = dict(PROCESSORS[name], num_layers=2, num_channels=C, num_chunks=1, cpu_offload=False)
    cfg = OmegaConf.create({"model": OmegaConf.create(block_yaml)})
    cfg.model.processor = OmegaConf.create(
        {
            "_target_": f"anemoi.models.layers.processor.{name}",
            **options,
            "layer_kernels": "${model.layer_kernels}",
        }
    )
    if name == "TransformerProcessor":  # anemoi's own schema accepts the block
        TransformerProcessorSchema(**OmegaConf.to_container(cfg.model.processor, resolve=True))
    with warnings.catch_warnings():
        # GraphTransformer: "triton not available, falling back to pyg"
        warnings.simplefilter("ignore")
        return instantiate(cfg.model.processor, _recursive_=False)


def forward_backward(name: str, proc: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, C, generator=g, requires_grad=True)
    if name in ("GNNProcessor", "GraphTransformerProcessor"):
        edge_index = torch.randint(0, N, (2, E), generator=g)
        edge_attr = torch.randn(E, EDGE_DIM, generator=g)
        y = proc(
            x,
            1,
            GraphShardInfo(nodes=[N], edges=[E]),
            edge_attr=edge_attr,
            edge_index=edge_index,
            edges_are_dst_sorted=False,
        )
    else:
        y = proc(x, 1, GraphShardInfo(nodes=[N]))
    assert y.shape == (N, C) and torch.isfinite(y).all()
    y.pow(2).mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    return y


def kernel_layers(
    proc: torch.nn.Module, norm_types: tuple, linear_types: tuple
) -> tuple[list, list, list]:
    """(norms from layer_kernels.LayerNorm, linears from layer_kernels.Linear, q/k norms)."""
    norms, linears, qk = [], [], []
    for name, m in proc.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("q_norm", "k_norm"):
            qk.append((name, m))
        elif isinstance(m, norm_types):
            norms.append((name, m))
        elif isinstance(m, linear_types) and leaf not in HARD_CODED_LINEARS:
            linears.append((name, m))
    return norms, linears, qk


def expected_classes(lock: kernel_lock.KernelLock) -> tuple[type, type]:
    lk = layer_kernels(lock)
    ln, lin = locate(lk["LayerNorm"]["_target_"]), locate(lk["Linear"]["_target_"])
    # the exported class is the lock's own (or an adapter subclassing it)
    assert issubclass(ln, import_target(lock.slots["LayerNorm"].target, lock.trusted_modules))
    assert issubclass(lin, import_target(lock.slots["Linear"].target, lock.trusted_modules))
    return ln, lin


@pytest.mark.parametrize("which", ["chosen", "pinned"])
@pytest.mark.parametrize("name", list(PROCESSORS))
@pytest.mark.slow
def test_processor_builds_the_locks_classes(locks, which, name):
    from kp_zoo.norms import GoodLayerNorm, GoodLinear

    lock = locks[which]
    ln_cls, lin_cls = expected_classes(lock)
    proc = build(name, exported_yaml(lock.path))
    forward_backward(name, proc)
    norms, linears, qk = kernel_layers(
        proc, (torch.nn.LayerNorm, GoodLayerNorm), (torch.nn.Linear, GoodLinear)
    )
    assert norms and linears
    assert {type(m) for _, m in norms} == {ln_cls}, norms
    assert {type(m) for _, m in linears} == {lin_cls}, linears
    for _, m in norms + linears:  # the lock's kwargs arrived; parameters took part in backward
        assert m.weight.grad is not None and bool(m.weight.grad.abs().sum() > 0), m
    ln_kwargs = lock.slots["LayerNorm"].kwargs
    assert all(m.eps == ln_kwargs["eps"] for _, m in norms)
    if "Activation" in lock.slots:  # the lock's GELU, in the form it pins (issue 39)
        gelus = [m for m in proc.modules() if isinstance(m, torch.nn.GELU)]
        assert gelus and {m.approximate for m in gelus} == {
            lock.slots["Activation"].kwargs["approximate"]
        }
    if PROCESSORS[name].get("qk_norm"):  # QueryNorm/KeyNorm not exported: anemoi's default stays
        assert qk and {type(m) for _, m in qk} == {AutocastLayerNorm}
    if name == "TransformerProcessor":  # the hard-coded q/k/v projections stay torch.nn.Linear
        assert {
            type(m) for n, m in proc.named_modules() if n.rsplit(".", 1)[-1] in HARD_CODED_LINEARS
        } == {torch.nn.Linear}


@pytest.mark.parametrize("name", ["TransformerProcessor", "GraphTransformerProcessor"])
def test_qk_norm_export_reaches_query_and_key_norms(locks, name, tmp_path, monkeypatch):
    from dataclasses import replace

    from kp_zoo.norms import GoodLayerNorm

    pinned = locks["pinned"]
    with pytest.raises(kernel_lock.LockFormatError, match="pins no `bias` switch"):
        # a --candidate pins eps only: it cannot be made bias-free
        layer_kernels(pinned, qk_norm=True)
    slot = replace(
        pinned.slots["LayerNorm"], kwargs={**pinned.slots["LayerNorm"].kwargs, "bias": True}
    )
    replace(pinned, slots={**pinned.slots, "LayerNorm": slot}).sealed().dump(tmp_path / "qk.toml")
    # anemoi's q/k norms cast their output back to the input dtype: the lock's kernel goes in the
    # adapter that keeps that cast (one row of data per kernel)
    monkeypatch.setitem(
        registry.AUTOCAST_ADAPTERS, "AutocastGoodLayerNorm", "kp_zoo.norms.GoodLayerNorm"
    )
    proc = build(name, exported_yaml(tmp_path / "qk.toml", "--qk-norm"))
    forward_backward(name, proc)
    _, _, qk = kernel_layers(proc, (), ())
    assert len(qk) == 4 and all(
        type(m) is adapters.AutocastGoodLayerNorm
        and isinstance(m, GoodLayerNorm)
        and m.bias is None
        and m.hidden == C // HEADS
        for _, m in qk
    )
    # torch.nn: anemoi's AutocastLayerNorm
    proc = build(name, exported_yaml(locks["chosen"].path, "--qk-norm"))
    _, _, qk = kernel_layers(proc, (), ())
    assert all(type(m) is AutocastLayerNorm and m.bias is None and m.eps == 1e-5 for _, m in qk)


HIDDEN_SIZE_LOCK = """\
lock-version = "1.0"
created-by = "hand"
trusted-modules = ["kp_zoo"]

[environment]
device-type = { value = "cpu", match = "exact" }

[slots.LayerNorm]
implementation = "fake.liger_layer_norm"
target = "kp_zoo.norms.HiddenSizeLayerNorm"
semantics = "layer_norm"
kwargs = { eps = 1e-5 }
"""


def test_adapter_target_for_a_liger_signature_class(monkeypatch, tmp_path):
    from kp_zoo.norms import HiddenSizeLayerNorm

    monkeypatch.setitem(
        registry.SIZE_ADAPTERS,
        "HiddenSizeLayerNormAnemoi",
        ("kp_zoo.norms.HiddenSizeLayerNorm", "hidden_size"),
    )
    lock_path = tmp_path / "lock.toml"
    write_sealed(lock_path, HIDDEN_SIZE_LOCK)
    # anemoi cannot use the class directly: its Transformer blocks call
    # LayerNorm(normalized_shape=C)
    direct = (
        "layer_kernels:\n  LayerNorm: {_target_: kp_zoo.norms.HiddenSizeLayerNorm, eps: 1.0e-05}\n"
    )
    with pytest.raises(
        InstantiationException, match="unexpected keyword argument 'normalized_shape'"
    ):
        build("TransformerProcessor", direct)
    exported = exported_yaml(lock_path)
    assert "_target_: kernel_lock.adapters.HiddenSizeLayerNormAnemoi" in exported
    for name in (
        "TransformerProcessor",
        "PointWiseMLPProcessor",
    ):  # keyword and positional call sites
        proc = build(name, exported)
        forward_backward(name, proc)
        norms, _, _ = kernel_layers(proc, (torch.nn.LayerNorm, HiddenSizeLayerNorm), ())
        assert norms and {type(m) for _, m in norms} == {adapters.HiddenSizeLayerNormAnemoi}
        assert all(m.hidden_size == m.weight.shape[0] in (C, 2 * C) for _, m in norms)
    # same state-dict keys as anemoi's default torch.nn.LayerNorm: checkpoints load strictly both
    # ways
    adapted = build("TransformerProcessor", exported)
    plain = build("TransformerProcessor", "layer_kernels: {}\n")
    assert list(adapted.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(adapted.state_dict(), strict=True)
    adapted.load_state_dict(plain.state_dict(), strict=True)
    # anemoi checkpoints are pickled models: the adapter class must be found again
    again = pickle.loads(pickle.dumps(adapted))
    assert type(again.proc[0].layer_norm_attention) is adapters.HiddenSizeLayerNormAnemoi


@pytest.mark.slow
def test_check_config_knows_anemois_own_classes(locks, tmp_path, capsys):
    import yaml

    lock = locks["chosen"]
    # the ensemble layout: the processor has its own block, with anemoi's ConditionalLayerNorm
    model = {
        "num_channels": C,
        "layer_kernels": layer_kernels(lock),
        "processor": {
            "layer_kernels": {
                "LayerNorm": {
                    "_target_": "anemoi.models.layers.normalization.ConditionalLayerNorm",
                    "condition_shape": 16,
                    "zero_init": True,
                    "autocast": False,
                },
                "QueryNorm": {
                    "_target_": "anemoi.models.layers.normalization.AutocastLayerNorm",
                    "bias": False,
                },
            }
        },
        "encoders": {"0": {"mapper": {"layer_kernels": "${model.layer_kernels}"}}},
    }
    config = tmp_path / "ens.yaml"
    config.write_text(yaml.safe_dump({"model": model}, sort_keys=False))
    capsys.readouterr()
    code = main(["check-config", str(config), "--lock", str(lock.path)])
    out = capsys.readouterr().out
    assert code == 0, out  # the processor's Linear is anemoi's default, which agrees with the lock
    assert "ConditionalLayerNorm is a different layer" in out and "0 error(s)" in out
    assert "model.encoders.0.mapper.layer_kernels: inherits model.layer_kernels" in out
    # anemoi's AutocastLayerNorm takes *args/**kwargs and passes them on: it fits every call site
    config.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "layer_kernels": {
                        "LayerNorm": {
                            "_target_": "anemoi.models.layers.normalization.AutocastLayerNorm"
                        },
                        "Linear": {"_target_": "anemoi.models.layers.NoSuchLinear"},
                    }
                }
            }
        )
    )
    code = main(["check-config", str(config)])
    out = capsys.readouterr().out
    assert code == 5 and "NoSuchLinear" in out and "AutocastLayerNorm" not in out, out


@pytest.mark.slow
def test_readme_section_runs_as_written(tmp_path):
    """docs/anemoi.md "Using with anemoi" (the README's section until issue 37): its kernel-probe
    commands and its Python snippet, as written: the probe traces training.yaml (`--model
    anemoi:training.yaml`, issue 53), a gnn config at CPU sizes (an O16 dataset by name, TriNodes
    r2 hidden), and probes it here."""
    pytest.importorskip(
        "anemoi.training",
        reason="anemoi-training (its presets) is not installed: `bash .ci/anemoi-install`",
    )

    import yaml

    # the user's training.yaml: anemoi-training's defaults list with the gnn preset (README:
    # `defaults: [..., model: gnn, ...]`), complete enough for anemoi-training's schema, which
    # check-config runs
    from tests.anemoi_build import write_overlay

    training = write_overlay(tmp_path / "training.yaml", "gnn")
    body = yaml.safe_load(training.read_text())
    body["system"]["input"]["dataset"] = "/nonexistent/aifs-o16-unused.zarr"
    body["graph"] = {"nodes": {"hidden": {"node_builder": {"resolution": 2}}}}
    training.write_text(yaml.safe_dump(body, sort_keys=False))
    root = Path(__file__).resolve().parents[2]
    section = (
        (root / "docs" / "anemoi.md")
        .read_text()
        .split("## Using with anemoi", 1)[1]
        .split("\n## ", 1)[0]
    )
    blocks: dict[str, list[str]] = {"bash": [], "python": []}
    for lang, body in re.findall(r"```(bash|python)\n(.*?)```", section, re.DOTALL):
        blocks[lang].append(body)
    [bash], [snippet] = blocks["bash"], blocks["python"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    probe = f"{sys.executable} -m kernel_probe"
    commands = [
        line.split("  #")[0].strip()
        for line in bash.splitlines()
        if line.startswith("kernel-probe")
    ]
    assert [c.split()[1] for c in commands] == ["--model", "export", "export", "check-config"]
    for command in commands:
        # the printed overlay merged into training.yaml's model node, as step 3 says
        if "check-config" in command:
            user = yaml.safe_load((tmp_path / "training.yaml").read_text())
            user["model"] = yaml.safe_load((tmp_path / "kernel-lock.overlay.yaml").read_text())[
                "model"
            ]
            (tmp_path / "training.yaml").write_text(yaml.safe_dump(user))
        proc = subprocess.run(
            ["bash", "-c", command.replace("kernel-probe", probe, 1)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        if command.startswith("kernel-probe --model"):
            traced = kernel_lock.load(tmp_path / "kernel-lock.toml").model
            assert traced is not None and traced.spec == "anemoi:training.yaml" and traced.sites
        if "check-config" in command:
            assert "keeps anemoi's AutocastLayerNorm" in proc.stdout and "0 error(s)" in proc.stdout
    assert "${model.kernel_lock.Linear}" in (tmp_path / "kernel-lock.overlay.yaml").read_text()
    (tmp_path / "snippet.py").write_text(snippet)
    proc = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    built, named = proc.stdout.split()
    assert named.rsplit(".", 1)[1] == built  # the class anemoi built is the one the lock named


@pytest.mark.slow
def test_real_liger_adapter_builds_inside_anemoi():
    """Construction only (liger's forward needs a GPU): anemoi cannot build LigerLayerNorm, it can
    build the adapter."""
    pytest.importorskip("liger_kernel.transformers", reason="liger-kernel is not installed")
    from liger_kernel.transformers import LigerLayerNorm

    direct = (
        "layer_kernels:\n  LayerNorm: {_target_: liger_kernel.transformers.LigerLayerNorm, eps: "
        "1.0e-05}\n"
    )
    with pytest.raises(
        InstantiationException, match="unexpected keyword argument 'normalized_shape'"
    ):
        build("TransformerProcessor", direct)
    for name in ("TransformerProcessor", "PointWiseMLPProcessor"):
        proc = build(
            name,
            direct.replace(
                "liger_kernel.transformers.LigerLayerNorm",
                "kernel_lock.adapters.LigerLayerNormAnemoi",
            ),
        )
        norms, _, _ = kernel_layers(proc, (torch.nn.LayerNorm, LigerLayerNorm), ())
        assert norms and {type(m) for _, m in norms} == {adapters.LigerLayerNormAnemoi}
        assert all(sorted(m.state_dict()) == ["bias", "weight"] and m.eps == 1e-5 for _, m in norms)
