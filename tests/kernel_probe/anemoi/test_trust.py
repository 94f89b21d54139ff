"""kernel_probe/anemoi/reading.py: what check-config and ``export --config`` may import for a
config."""

from __future__ import annotations

import argparse

import pytest

from kernel_lock.errors import BadEnvironmentVariable
from kernel_probe.anemoi.reading import (
    CONFIG_ROOTS,
    NO_TRUST,
    OWN_TARGETS_FLAG,
    SEARCH_ROOTS,
    Trust,
    add_config_trust_argument,
    config_trust,
)

PRIVATE = "never imported"
UNTRUSTED = "not checked: module not trusted"


@pytest.mark.parametrize(
    "trust,target,severity,words",
    [
        (NO_TRUST, "torch.nn.LayerNorm", None, ""),
        (NO_TRUST, "kernel_lock.adapters.CompiledLayerNorm", None, ""),
        (
            NO_TRUST,
            "anemoi.models.layers.normalization.AutocastLayerNorm",
            None,
            "",
        ),  # CONFIG_ROOTS
        (
            NO_TRUST,
            "anemoi.training.X",
            "warning",
            UNTRUSTED,
        ),  # anemoi-training is not anemoi-models
        (
            NO_TRUST,
            "torchvision.ops.FrozenBatchNorm2d",
            "warning",
            UNTRUSTED,
        ),  # `torch` is no prefix of it
        (NO_TRUST, "kp_zoo.norms.GoodLayerNorm", "warning", "`--trust kp_zoo`"),
        (Trust(("kp_zoo",)), "kp_zoo.norms.GoodLayerNorm", None, ""),
        (Trust(own_targets=True), "kp_evil.Evil", None, ""),
        # __main__ and private modules: never, whatever is trusted
        (Trust(("kp_zoo",), own_targets=True), "kp_zoo._impl.Norm", "error", PRIVATE),
        (Trust(own_targets=True), "__main__.Norm", "error", PRIVATE),
        (Trust(("kp_zoo",)), "kp_zoo.norms.__main__", "error", PRIVATE),
        # a generic adapter is trusted only with the kernel it wraps
        (NO_TRUST, "kernel_lock.adapters.Autocast__kp_evil__Evil", "warning", "'kp_evil.Evil'"),
        (Trust(("kp_evil",)), "kernel_lock.adapters.Autocast__kp_evil__Evil", None, ""),
    ],
)
def test_refusal(trust, target, severity, words):
    refusal = trust.refusal(target)
    if severity is None:
        assert refusal is None
        return
    assert (
        refusal is not None and refusal[0] == severity and words in f"{refusal[1]} {refusal[2]}"
    ), refusal


def test_an_untrusted_targets_fix_names_both_ways_to_grant_it():
    _, problem, fix = NO_TRUST.refusal("kp_evil.sub.Evil")
    assert "'kp_evil.sub.Evil' is outside the import allow-list" in problem
    assert "`--trust kp_evil` (or $KERNEL_LOCK_TRUST=kp_evil)" in fix and OWN_TARGETS_FLAG in fix


@pytest.mark.parametrize(
    "modules,roots",
    [((), SEARCH_ROOTS), (("kp_zoo", "site_confs"), (*SEARCH_ROOTS, "kp_zoo", "site_confs"))],
)
def test_search_roots(modules, roots):
    assert Trust(modules).search_roots() == roots
    # only anemoi-training ships configs
    assert "anemoi.training" in roots and "anemoi.models" not in roots
    assert CONFIG_ROOTS == ("anemoi.models",)


@pytest.mark.parametrize(
    "env,trust,own,want",
    [
        (None, [], False, Trust()),
        (None, ["kp_zoo"], True, Trust(("kp_zoo",), True)),
        (
            "a,b:c d",
            ["kp_zoo", "a"],
            False,
            Trust(("kp_zoo", "a", "b", "c", "d")),
        ),  # deduplicated, in order
    ],
)
def test_granted_and_config_trust(monkeypatch, env, trust, own, want):
    if env is None:
        monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    else:
        monkeypatch.setenv("KERNEL_LOCK_TRUST", env)
    assert Trust.granted(trust, own_targets=own) == want
    p = argparse.ArgumentParser()
    p.add_argument("--trust", action="append", default=[])
    add_config_trust_argument(p)
    args = p.parse_args(
        [x for name in trust for x in ("--trust", name)] + ([OWN_TARGETS_FLAG] if own else [])
    )
    assert config_trust(args) == want


@pytest.mark.parametrize("bad", ["bad name!", "_private", "a..b"])
def test_a_bad_trusted_name_is_refused(monkeypatch, bad):
    monkeypatch.delenv("KERNEL_LOCK_TRUST", raising=False)
    with pytest.raises(BadEnvironmentVariable, match="not a public module name"):
        Trust.granted([bad])
    monkeypatch.setenv("KERNEL_LOCK_TRUST", bad)
    with pytest.raises(BadEnvironmentVariable) as exc:
        Trust.granted()
    assert "$KERNEL_LOCK_TRUST" in str(exc.value)
