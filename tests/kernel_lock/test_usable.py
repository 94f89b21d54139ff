"""One usability rule per slot (``kernel_lock.trust.unusable``): ``verify``, the probe's reuse
decision (``--check``) and ``factory`` agree on every case of requirements, devices and mode."""

from __future__ import annotations

import pytest

from kernel_lock import fingerprint
from kernel_lock.errors import KernelUnavailable, LockMismatch
from kernel_lock.trust import unusable
from kernel_probe.probe.pipeline import reusable
from tests.conftest import edited_lock, sealed_lock, write_sealed

HERE = fingerprint.current()["device-type"]
ELSEWHERE = "rocm" if HERE != "rocm" else "cuda"
CASES = {
    "usable": ("", True),
    "devices here": (f'devices = ["{HERE}"]', True),
    "devices elsewhere": (f'devices = ["{ELSEWHERE}"]', False),
    "requirement missing": (
        'requires = [{ name = "liger-kernel", specifier = ">=999", module = "liger_kernel" }]',
        False,
    ),
}


def _text(extra: str) -> str:
    return edited_lock(**{"kwargs = { bias = false }\n": f"kwargs = {{ bias = false }}\n{extra}\n"})


def _outcomes(tmp_path, extra: str) -> tuple[bool, bool, bool]:
    """(verify passes, the probe would reuse it, factory builds it) for the Linear slot."""
    lock = sealed_lock(_text(extra))
    try:
        lock.verify("training")
        verified = True
    except LockMismatch:
        verified = False
    # the probe's reuse decision (--check): no [provenance] inputs here, so only usability decides
    reused, _ = reusable(write_sealed(tmp_path / "k.toml", _text(extra)), None)  # type: ignore[arg-type]
    try:
        lock.factory("Linear", "training")
        built = True
    except KernelUnavailable:
        built = False
    return verified, reused is not None, built


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_reuse_and_factory_agree(case, tmp_path):
    extra, usable_here = CASES[case]
    assert _outcomes(tmp_path, extra) == (usable_here,) * 3


def test_a_slot_pinned_to_another_device_is_named_with_its_field():
    lock = sealed_lock(_text(f'devices = ["{ELSEWHERE}"]'))
    with pytest.raises(LockMismatch) as caught:
        lock.verify("training")
    (diff,) = caught.value.differences
    assert diff.field == "slots.Linear.devices" and diff.found == HERE
    assert "run on a device the slot runs on" in (caught.value.fix or "")
    with pytest.raises(KernelUnavailable) as refused:
        lock.factory("Linear", "training")
    assert refused.value.key == "slots.Linear.devices"


def test_the_rule_covers_requirements_devices_and_mode():
    slot = sealed_lock(_text(f'devices = ["{ELSEWHERE}"]')).slots["Linear"]
    here = {"device-type": HERE}
    assert [d.rule for d in unusable(slot, here, "training", "inference")] == ["mode", "devices"]
    assert [d.rule for d in unusable(slot, here, "inference", "inference")] == ["devices"]
    assert unusable(slot, {"device-type": ELSEWHERE}, "training") == []
