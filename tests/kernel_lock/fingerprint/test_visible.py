"""CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES read as CUDA and ROCm read
them (issue 24, point 3), with the installed torch's own parser as the reference: for every value of
the corpus, the devices kernel_lock counts without torch are the ones torch counts, or kernel_lock
says it is unsure (None) and the fingerprint falls back to torch. Never a guess."""

from __future__ import annotations

import pytest
import torch

from kernel_lock import host

UUIDS = ["GPU-0a1b2c3d-aaaa", "GPU-0a1b9999-bbbb", "GPU-77777777-cccc", "GPU-88888888-dddd"]
CORPUS = [
    "",
    "-1",
    "0",
    "1",
    "0,1",
    "1,0",
    "0,0",
    "1,1,2",
    "0gpu",
    "1gpu2,2ampere",
    "+1",
    " 1",
    "1 ",
    "1,-1,2",
    "0,7,1",
    "7",
    "3,2,1,0",
    "0,2,",
    ",0",
    "abc",
    "-0",
    "+",
    "GPU-77777777-cccc",
    "GPU-7",
    "GPU-0a1b",  # ambiguous prefix
    "GPU-0a1b2",
    "GPU-77777777-cccc,GPU-88888888-dddd",
    "GPU-7,GPU-7",
    "GPU-7,GPU-77777777-cccc",  # two spellings of one device
    "GPU-8,0",
    "GPU-",
    "GPU-nomatch,GPU-8",
    "MIG-11111111-2222",
    "MIG-a,MIG-a",
    "0,GPU-8",
]


def _torch_cuda_count(monkeypatch, value: str) -> int:
    """What torch counts for ``value`` on a CUDA build with the devices ``UUIDS`` (its NVML
    path)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", lambda: len(UUIDS))
    monkeypatch.setattr(torch.cuda, "_raw_device_uuid_nvml", lambda: list(UUIDS))
    return torch.cuda._device_count_nvml()


@pytest.mark.parametrize("value", CORPUS)
def test_cuda_visible_devices_read_as_torch_reads_them(monkeypatch, value):
    ours = host.visible_nvml_indices(value, UUIDS)
    try:
        reference = _torch_cuda_count(monkeypatch, value)
    except ValueError:  # torch's own parser fails on it ("+"): not ours to guess
        assert ours is None
        return
    if ours is None:  # unsure: the fingerprint asks torch, which is always right by definition
        mixed = "GPU-" in value and any(item.strip()[:1].isdigit() for item in value.split(","))
        assert value.startswith("MIG-") or value.lstrip(" ").startswith(("-0", "+")) or mixed, value
        return
    assert len(ours) == reference, (value, ours, reference)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0,0", []),
        ("0gpu", [0]),
        ("1,1,2", []),
        ("", []),
        ("-1", []),
        ("+1", [1]),
        (" 1", [1]),
        ("1,-1,2", [1]),
    ],
)
def test_the_issue_cases(value, expected):
    """CUDA reads 0,0 as no device and 0gpu as device 0 (kernel_lock read them as one device and
    none)."""
    assert host.visible_nvml_indices(value, UUIDS) == expected


def test_uuid_forms_map_to_their_devices():
    assert host.visible_nvml_indices("GPU-77777777-cccc,GPU-8", UUIDS) == [2, 3]
    # ambiguous prefix: invalid, ends the list
    assert host.visible_nvml_indices("GPU-0a1b", UUIDS) == []
    # MIG: torch counts those
    assert host.visible_nvml_indices("MIG-11111111-2222", UUIDS) is None


ROCM_CORPUS = [
    {},
    {"HIP_VISIBLE_DEVICES": "1"},
    {"HIP_VISIBLE_DEVICES": "1,0"},
    {"HIP_VISIBLE_DEVICES": "0,0"},
    {"HIP_VISIBLE_DEVICES": "0gpu"},
    {"HIP_VISIBLE_DEVICES": ""},
    {"HIP_VISIBLE_DEVICES": "-1"},
    {"HIP_VISIBLE_DEVICES": "+1"},
    {"HIP_VISIBLE_DEVICES": " 1"},
    {"HIP_VISIBLE_DEVICES": "1,-1,2"},
    {"HIP_VISIBLE_DEVICES": "9"},
    {"HIP_VISIBLE_DEVICES": "GPU-77777777"},
    {"CUDA_VISIBLE_DEVICES": "2,3"},
    {"ROCR_VISIBLE_DEVICES": "2"},
    {"ROCR_VISIBLE_DEVICES": "2,3"},
    {"ROCR_VISIBLE_DEVICES": "1,1"},
    {"ROCR_VISIBLE_DEVICES": "0gpu"},
    {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"},
    {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1,0"},
    {"ROCR_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"},
    {"ROCR_VISIBLE_DEVICES": "GPU-aa"},
]


def _torch_rocm_count(monkeypatch, env: dict[str, str]) -> int:
    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.version, "hip", "6.2.41134")
    monkeypatch.setattr(torch.cuda, "_raw_device_count_amdsmi", lambda: len(UUIDS))
    monkeypatch.setattr(torch.cuda, "_raw_device_uuid_amdsmi", lambda: [u[4:] for u in UUIDS])
    return torch.cuda._device_count_amdsmi()


@pytest.mark.parametrize(
    "env", ROCM_CORPUS, ids=lambda e: ",".join(f"{k[:4]}={v}" for k, v in e.items()) or "unset"
)
def test_rocm_visibility_read_as_torch_reads_it(monkeypatch, env):
    ours = host.rocm_visible_indices(env, len(UUIDS))
    reference = _torch_rocm_count(monkeypatch, env)
    if ours is not None:
        assert len(ours) == reference, (env, ours, reference)
    # unsure: only values whose reading differs between ROCr, HIP and torch, or are not plain
    # indices
    else:
        plain = all(v and all(i.isdigit() for i in v.split(",")) for v in env.values())
        distinct = all(len(set(v.split(","))) == len(v.split(",")) for v in env.values())
        in_range = all(
            int(i) < len(UUIDS) for v in env.values() for i in v.split(",") if i.isdigit()
        )
        cuda_beside_rocr = "ROCR_VISIBLE_DEVICES" in env and "CUDA_VISIBLE_DEVICES" in env
        assert not (plain and distinct and in_range) or cuda_beside_rocr, env


def test_rocm_hip_indexes_into_rocr():
    assert host.rocm_visible_indices(
        {"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, 4
    ) == [3]
    # never guessed on ROCm
    assert host.rocm_visible_indices({"HIP_VISIBLE_DEVICES": "0gpu"}, 4) is None


# ---- the torch-free fingerprint on an 8-GPU H100 node
# (the driver tree of tests/kernel_lock/fingerprint/test_torchless.py)
@pytest.mark.parametrize(
    "value, count",
    [
        ("0,0", None),
        ("0gpu", 1),
        ("1,1,2", None),
        ("+1", 1),
        (" 1", 1),
        ("1,-1,2", 1),
        ("-1", None),
        ("", None),
    ],
)
def test_torch_free_fingerprint_counts_as_cuda_does(tmp_path, value, count):
    """``0,0`` hides every GPU (torch reports the CPU) and ``0gpu`` is GPU 0 (kernel_lock read the
    first as one GPU and the second as none)."""
    from tests.kernel_lock.fingerprint.test_torchless import CUDA_BUILD, h100_node, run

    fields, notes = run(
        tmp_path, CUDA_BUILD, h100_node(tmp_path / "root"), {"CUDA_VISIBLE_DEVICES": value}
    )
    assert notes.complete, notes.fallbacks
    if count is None:
        assert fields["device-type"] == "cpu"
    else:
        assert (fields["device-type"], fields["device-count"]) == ("cuda", count)


@pytest.mark.parametrize("value", ["GPU-00000003,5", "0,GPU-00000003", "-0", "+"])
def test_uncertain_values_fall_back_to_torch(tmp_path, value):
    from tests.kernel_lock.fingerprint.test_torchless import _fallback_fields, h100_node

    falls = _fallback_fields(
        tmp_path, h100_node(tmp_path / "root"), {"CUDA_VISIBLE_DEVICES": value}
    )
    assert "read differently by CUDA and torch" in falls["device-count"]
