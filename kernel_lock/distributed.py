"""Many ranks, one lock: :func:`check_ranks`. Reports travel as UTF-8 JSON in uint8
tensors (``all_gather_object`` pickles); all ranks reach one verdict, crashes included."""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from .errors import LockError, LockMismatch, RanksDisagree
from .lock import KernelLock
from .schema import DIGEST
from .tables import (
    MAX_TEXT,
    ReadError,
    get_int,
    get_required,
    get_strings,
    get_text,
    refuse_unknown,
)

__all__ = ["check_ranks", "judge", "local_report", "report_from_dict"]


def local_report(
    lock: KernelLock,
    *,
    rank: int = 0,
    mode: str | None = None,
    current: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What this rank says: rank, host, lock path, content digest, and its differences (strings)."""
    differences: list[str] = []
    try:
        lock.verify(mode, current=current)
    except LockMismatch as exc:
        differences = [str(d) for d in exc.differences]
    except LockError as exc:
        differences = [exc.problem]
    except Exception as exc:  # never leave the other ranks waiting on a rank that crashed checking
        differences = [f"checking failed: {type(exc).__name__}: {exc}"]
    digest = lock.compute_digest()
    host, path = socket.gethostname(), lock.path or "<lock>"
    return {"rank": rank, "host": host, "lock": path, "digest": digest, "differences": differences}


def _ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (64 ranks stay one line)."""
    runs = [
        [r for _, r in run] for _, run in groupby(enumerate(sorted(ranks)), lambda p: p[1] - p[0])
    ]
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _who(group: Sequence[Mapping[str, Any]], most: int = 8) -> str:
    """'rank 2 on nid003', or 'ranks 0-63 on nid001, nid002, ... (16 hosts)'."""
    ranks = [r["rank"] for r in group]
    hosts = list(dict.fromkeys(r["host"] for r in group))
    shown = ", ".join(hosts[:most]) + (f", ... ({len(hosts)} hosts)" if len(hosts) > most else "")
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {_ranks_text(ranks)} on {shown}"


def _grouped(reports: Sequence[Mapping[str, Any]], key: Any) -> dict[Any, list[Mapping[str, Any]]]:
    """Reports with the same key together (64 ranks with one problem are one entry)."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for r in reports:
        groups.setdefault(key(r), []).append(r)
    return groups


def judge(reports: Sequence[Mapping[str, Any]]) -> RanksDisagree | None:
    """The verdict on all ranks' reports: None, or the error to raise. The reference lock is
    the one most ranks hold (the lowest rank's on a tie)."""
    if not reports:
        return None
    counts = Counter(r["digest"] for r in reports)
    by_rank = sorted(reports, key=lambda r: r["rank"])
    first = {d: min(r["rank"] for r in by_rank if r["digest"] == d) for d in counts}
    reference = max(counts, key=lambda d: (counts[d], -first[d]))
    stray = [r for r in by_rank if r["digest"] != reference]
    mismatched = [r for r in by_rank if r["differences"]]
    if not stray and not mismatched:
        return None
    faulty = sorted({r["rank"] for r in stray} | {r["rank"] for r in mismatched})
    lines = [
        f"the kernel lock check failed on {len(faulty)} of {len(reports)} rank(s) "
        f"({_ranks_text(faulty)}):"
    ]
    fix = []
    if stray:
        holders = [r["rank"] for r in by_rank if r["digest"] == reference]
        lines.append(
            f"  {len(holders)} rank(s) ({_ranks_text(holders)}) hold lock {reference[:19]}; "
            f"{len(stray)} rank(s) hold a different lock:"
        )
        for (digest, path), group in _grouped(stray, lambda r: (r["digest"], r["lock"])).items():
            lines.append(f"    {_who(group)}: {digest[:19]} ({path})")
        fix.append(
            "give every rank the same lock file (write it once, e.g. `kernel-probe --out` on a "
            "shared path)"
        )
    if mismatched:
        lines.append(
            f"  {len(mismatched)} rank(s) run on a machine that does not match the lock they hold:"
        )
        by_problem = _grouped(mismatched, lambda r: (tuple(r["differences"]), r["lock"]))
        for (differences, path), group in by_problem.items():
            lines.append(f"    {_who(group)} ({path}):")
            lines.extend(f"      - {d}" for d in differences)
        fix.append("run the job on nodes that match the lock, or re-probe on them")
    return RanksDisagree(
        "\n".join(lines), reports=[dict(r) for r in by_rank], ranks=faulty, fix="; ".join(fix)
    )


def check_ranks(lock: KernelLock, *, group: Any = None, mode: str | None = None) -> None:
    """On every rank (a collective): all hold the same lock and match it, else RanksDisagree."""
    import torch.distributed as dist  # reason: torch only when the ranks are checked

    if not (dist.is_available() and dist.is_initialized()):
        reports = [local_report(lock, rank=0, mode=mode)]
    else:
        reports = _exchange(local_report(lock, rank=dist.get_rank(), mode=mode), group)
    error = judge(reports)
    if error is not None:
        raise error


def _exchange_device_type(backend: str) -> str:
    """Where the exchanged tensors live: "cpu" for gloo/mpi, "cuda" for nccl."""
    pairs = [
        part.split(":", 1) if ":" in part else ["", part] for part in backend.lower().split(",")
    ]
    devices = [device for device, _ in pairs if device]
    if devices:
        return "cpu" if "cpu" in devices else devices[0]
    return "cuda" if pairs[0][1] == "nccl" else "cpu"


def _exchange(mine: Mapping[str, Any], group: Any) -> list[dict[str, Any]]:
    """Every rank's report, in group-rank order, gathered as UTF-8 JSON bytes."""
    import torch  # reason: torch only when the ranks are checked
    import torch.distributed as dist

    backend = "unknown"
    try:
        backend = str(dist.get_backend(group))
        kind = _exchange_device_type(backend)
        device = torch.device("cpu")
        if kind != "cpu":
            device = torch.device(kind, getattr(torch, kind).current_device())
        world = dist.get_world_size(group)
        data = json.dumps(dict(mine), sort_keys=True).encode("utf-8")
        length = torch.tensor([len(data)], dtype=torch.int64, device=device)
        lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(lengths, length, group=group)
        sizes = [int(n.item()) for n in lengths]
        padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        gathered = [torch.empty(max(sizes), dtype=torch.uint8, device=device) for _ in range(world)]
        dist.all_gather(gathered, padded, group=group)
        raw = [bytes(t[:size].cpu().tolist()) for t, size in zip(gathered, sizes, strict=True)]
    except Exception as exc:  # every rank that gets here raises: none goes on with a partial view
        raise RanksDisagree(
            f"rank {mine['rank']} on {mine['host']} could not exchange its kernel lock report "
            f"with the other ranks (backend {backend}): {type(exc).__name__}: {exc}",
            reports=[dict(mine)],
            fix="call check_ranks on every rank of the group, after init_process_group and (with "
            "NCCL) torch.cuda.set_device(local_rank); if the process group itself is broken (a "
            "rank that died or timed out), fix that first: with NCCL, NCCL_DEBUG=INFO names the "
            "failing link",
        ) from exc
    return [_decoded(blob, index, backend) for index, blob in enumerate(raw)]


_KEYS = ("rank", "host", "lock", "digest", "differences")


def report_from_dict(data: Any) -> dict[str, Any]:
    """One rank's report, read by the typed reader (keys required, bounded, known)."""
    if not isinstance(data, dict):
        raise ReadError(f"expected a JSON object, got a JSON {type(data).__name__}")
    refuse_unknown(data, _KEYS)
    for key in _KEYS:
        get_required(data, key, list if key == "differences" else (int if key == "rank" else str))
    rank = get_int(data, "rank", 0, 1 << 24)  # bounds: a report this module never wrote
    host, lock = get_text(data, "host", limit=255), get_text(data, "lock")  # DNS: 253
    digest = get_text(data, "digest", limit=80)
    if not DIGEST.fullmatch(digest or ""):
        raise ReadError(f"{digest!r:.80} is not 'sha256:<64 hex digits>'", "digest")
    differences = get_strings(data, "differences")
    if len(differences) > 256:
        raise ReadError(
            f"{len(differences)} entries, more than the 256 a report may have", "differences"
        )
    for i, text in enumerate(differences):
        if len(text) > MAX_TEXT:
            raise ReadError(
                f"a string of {len(text)} characters, more than the {MAX_TEXT} it may have",
                f"differences[{i}]",
            )
    return dict(zip(_KEYS, (rank, host, lock, digest, [*differences]), strict=True))


def _decoded(blob: bytes, index: int, backend: str) -> dict[str, Any]:
    """One gathered report back from its bytes, refused unless :func:`report_from_dict` reads it."""
    try:
        return report_from_dict(json.loads(blob.decode("utf-8")))
    except (ValueError, RecursionError) as exc:  # ReadError and the decoders' are ValueErrors
        read = exc if isinstance(exc, ReadError) else None
        key = f", key {read.key!r}" if read and read.key else ""
        fix = f"{read.fix}; " if read and read.fix else ""
        raise RanksDisagree(
            f"the kernel lock report of group rank {index} did not decode (backend {backend})"
            f"{key}: {read.problem if read else exc}; received {blob[:80]!r}"
            f"{'...' if len(blob) > 80 else ''}",
            ranks=[index],
            fix=f"{fix}run the same kernel_lock version on every rank (one environment for the "
            "whole job), and do not run other collectives on the group concurrently with "
            "check_ranks",
        ) from exc
