"""Site signals: hostname, Slurm variables and known site markers, recorded as found.

Deciding *which* site this is belongs to the site profiles; here only the evidence is collected.
Markers are data (``SITE_MARKERS``): adding a site is adding a row. A ``nid`` hostname alone says
"HPE Cray EX" (LUMI, Alps, Perlmutter, Isambard-AI all use it), not which site.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SiteMarker:
    """An environment variable or file that some site sets, reported as a hint for its profile."""

    kind: str  # "env": an environment variable; "file": a file whose first line is the value
    name: str
    hint: str  # which site it usually means (a hint for the profiles, not a verdict)


SITE_MARKERS: tuple[SiteMarker, ...] = (
    SiteMarker("env", "LUMI_STACK_NAME", "LUMI (CSC)"),
    SiteMarker("env", "LUMI_STACK_PARTITION", "LUMI (CSC)"),
    SiteMarker("env", "SYSTEMNAME", "JSC (juwelsbooster, jurecadc, jupiter)"),
    SiteMarker("file", "/etc/FZJ/systemname", "JSC (juwelsbooster, jurecadc, jupiter)"),
    SiteMarker("env", "CLUSTER_NAME", "CSCS Alps (daint, clariden, santis)"),
    SiteMarker("env", "NERSC_HOST", "NERSC (perlmutter)"),
    SiteMarker("env", "BSC_MACHINE", "BSC (mn5)"),
    SiteMarker("env", "HPCPERM", "ECMWF Atos HPC2020"),
    SiteMarker("env", "ALL_CCFRWORK", "IDRIS Jean Zay"),
    SiteMarker("env", "PROJECTDIR", "Isambard-AI (BriCS), among others"),
)

# Slurm variables worth keeping with a lock (which cluster, job, partition and GPU allocation).
SLURM_VARIABLES: tuple[str, ...] = (
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_ID",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_QOS",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
)


MARKER_BYTES = 64 << 10  # a marker file is one short line


def read_marker(path: str, limit: int = MARKER_BYTES) -> tuple[str | None, str]:
    """(the first line of the marker file at ``path`` or None, why it was not read: '' if absent or
    read).

    Read like every input (``kernel_lock.files``): a regular file only, opened non-blocking (a
    FIFO cannot hang the job start), at most ``limit`` bytes (``/dev/zero`` is never read)."""
    from kernel_lock.files import UnsafeFile, read_regular

    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        return None, ""
    except UnsafeFile as exc:
        return None, f"{exc.problem}: not read"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    return data.decode("utf-8", errors="replace").partition("\n")[0].strip() or None, ""


def first_line(path: str) -> str | None:
    """The first line of the marker file at ``path`` (None when it cannot be read)."""
    return read_marker(path)[0]


def detect_site(
    env: Mapping[str, str] | None = None,
    *,
    hostname: str | None = None,
    markers: tuple[SiteMarker, ...] = SITE_MARKERS,
) -> dict[str, Any]:
    """The hostname, the Slurm variables set and the site markers found (environment variables,
    files)."""
    env = os.environ if env is None else env
    found = []
    for marker in markers:
        value = env.get(marker.name) if marker.kind == "env" else first_line(marker.name)
        if value:
            found.append(
                {"signal": f"{marker.kind}:{marker.name}", "value": value, "hint": marker.hint}
            )
    return {
        "hostname": hostname if hostname is not None else socket.gethostname(),
        "slurm": {name: env[name] for name in SLURM_VARIABLES if name in env},
        "markers": found,
    }
