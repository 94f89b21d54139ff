"""Which devices this process sees: the visibility variables read as CUDA, ROCr and HIP read them.

``CUDA_VISIBLE_DEVICES`` (CUDA; on ROCm, HIP also honours it), ``ROCR_VISIBLE_DEVICES`` and
``HIP_VISIBLE_DEVICES`` (ROCm). Only a reading that is certain is given; None means "ask torch".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..errors import DeviceVisibilityError

__all__ = [
    "cuda_visible_entries",
    "physical_devices",
    "rocm_visible_indices",
    "visible_nvml_indices",
]


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")]


def physical_devices(device_type: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The node-level id of each device this process sees, in torch's order; None when nothing
    restricts it.

    ROCm applies ``ROCR_VISIBLE_DEVICES`` first (node ids or UUIDs), then ``HIP_VISIBLE_DEVICES``
    (or ``CUDA_VISIBLE_DEVICES``), whose indices count within what ROCR left; CUDA applies
    ``CUDA_VISIBLE_DEVICES``. With LUMI's per-rank ``ROCR_VISIBLE_DEVICES=$SLURM_LOCALID`` every
    rank sees one device 0, and only this tells them apart. An entry that cannot be mapped is
    ``'?'``. On ROCm, a HIP list longer than the ROCR list is the contradiction torch refuses
    (``device_count()`` raises "HIP_VISIBLE_DEVICES contains more devices than
    ROCR_VISIBLE_DEVICES"): raised here as ``DeviceVisibilityError`` naming both values.
    """
    env = os.environ if env is None else env
    if device_type == "rocm":
        rocr = env.get("ROCR_VISIBLE_DEVICES")
        hip_name = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env else "CUDA_VISIBLE_DEVICES"
        hip = env.get(hip_name)
        if rocr is None:
            return None if hip is None else _entries(hip)
        base = _entries(rocr)
        if hip is None:
            return base
        chosen = _entries(hip)
        if len(chosen) > len(base) and hip_name == "HIP_VISIBLE_DEVICES":
            raise DeviceVisibilityError(
                f"{hip_name}={hip!r} names {len(chosen)} device(s) but "
                f"ROCR_VISIBLE_DEVICES={rocr!r} leaves only {len(base)}: the HIP list indexes "
                "into the ROCR list, so which GPU this process uses is undefined (torch refuses "
                "to count devices)",
                key=hip_name,
                fix=f"set one of them: unset {hip_name} (ROCR_VISIBLE_DEVICES alone selects "
                "node devices), or "
                f"give {hip_name} indices 0..{len(base) - 1} into ROCR_VISIBLE_DEVICES's list",
            )
        return [base[int(e)] if e.isdigit() and int(e) < len(base) else "?" for e in chosen]
    if device_type == "cuda":
        visible = env.get("CUDA_VISIBLE_DEVICES")
        return None if visible is None else _entries(visible)
    return None


_PLAIN_INDEX = re.compile(r"[0-9]+", re.ASCII)


def rocm_visible_indices(env: Mapping[str, str], count: int) -> list[int] | None:
    """Node indices (KFD GPU order) of the GPUs HIP will see, in HIP's order, among ``count`` GPUs;
    None where ROCm's reading is not certain, so the caller asks torch.

    ROCR_VISIBLE_DEVICES selects node GPUs first; HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES)
    then indexes into what ROCR left. Only lists of distinct plain indices within range are read
    here: UUIDs, repeats, signs, spaces, out-of-range or empty items (whose handling differs between
    ROCr, HIP and torch's parser) are left to torch, and so is CUDA_VISIBLE_DEVICES beside
    ROCR_VISIBLE_DEVICES (HIP honours it, torch's parser does not). Contradictory variables raise as
    :func:`physical_devices` does.
    """
    physical_devices("rocm", env)  # raises DeviceVisibilityError on a HIP list longer than ROCR's
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    hip = env.get("HIP_VISIBLE_DEVICES")
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if rocr is not None and hip is None and cuda is not None:
        return None

    def indices(value: str, limit: int) -> list[int] | None:
        items = value.split(",")
        if not all(_PLAIN_INDEX.fullmatch(i) for i in items):
            return None
        out = [int(i) for i in items]
        return out if len(set(out)) == len(out) and all(i < limit for i in out) else None

    base = list(range(count)) if rocr is None else indices(rocr, count)
    if base is None:
        return None
    chosen = hip if hip is not None else cuda
    if chosen is None:
        return base
    picked = indices(chosen, len(base))
    return None if picked is None else [base[i] for i in picked]


_ORDINAL = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _ordinal(item: str) -> int | None:
    """The leading integer of one CUDA_VISIBLE_DEVICES item as CUDA reads it (strtoul-like: ``0gpu``
    is 0, ``+1`` is 1, ``-1`` and a non-number are -1, which ends the list); None where that reading
    is not certain (a lone sign, ``-0``), so the caller asks torch."""
    m = _ORDINAL.match(item)
    if m is None:
        return None if item[:1] in ("+", "-") else -1
    text = m.group(0)
    if text.startswith("-"):
        return -1 if text.strip("-0") else None
    return int(text)


def cuda_visible_entries(visible: str) -> list[int] | list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA parses it, before it is matched against the devices: ordinals,
    or ``GPU-`` / ``MIG-`` UUIDs (full or a prefix). Items are read in order up to the first invalid
    one (a negative or non-numeric item, or one without the list's UUID prefix); a repeated item
    means no device at all (``0,0`` -> []). None where a rule is not certain: :func:`_ordinal`'s
    cases, and ordinals and UUIDs mixed in one list (torch's parser stops at the first of the other
    kind; CUDA's documentation does not say). The reference for these rules is torch's own parser
    (``torch.cuda._parse_visible_devices``): the tests compare the two over a corpus of values."""
    for prefix in ("GPU-", "MIG-"):
        if visible.startswith(prefix):
            uuids: list[str] = []
            for item in visible.split(","):
                if item in uuids:
                    return []
                if not item.startswith(prefix):
                    if item.strip()[:1].isdigit() or item.startswith(("GPU-", "MIG-")):
                        # ordinals or the other UUID kind after UUIDs: CUDA's reading is not certain
                        return None
                    break
                uuids.append(item)
            return uuids
    ordinals: list[int] = []
    for item in visible.split(","):
        if item.strip().startswith(("GPU-", "MIG-")):
            return None  # a UUID after ordinals: CUDA's reading is not certain
        x = _ordinal(item.strip())
        if x is None:
            return None
        if x in ordinals:
            return []
        if x < 0:
            break
        ordinals.append(x)
    return ordinals


def visible_nvml_indices(visible: str | None, uuids: list[str]) -> list[int] | None:
    """NVML indices of the devices CUDA will see, in CUDA's order (NVML ignores
    CUDA_VISIBLE_DEVICES).

    ``visible`` is the value of CUDA_VISIBLE_DEVICES (None when unset); ``uuids`` are NVML's device
    UUIDs by NVML index. Parsed by :func:`cuda_visible_entries`; an ordinal at or beyond the device
    count, or a UUID prefix that matches no device or several, ends the list; the same device twice
    means none. MIG entries cannot be mapped from the parent GPU list, and an uncertain reading is
    not guessed: None means "ask torch instead".
    """
    if visible is None:
        return list(range(len(uuids)))
    entries = cuda_visible_entries(visible)
    if entries is None or (
        entries and isinstance(entries[0], str) and entries[0].startswith("MIG-")
    ):
        return None
    out: list[int] = []
    for entry in entries:
        if isinstance(entry, int):
            if entry >= len(uuids):
                break
            index = entry
        else:
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
            if index in out:
                return []
        out.append(index)
    return out
