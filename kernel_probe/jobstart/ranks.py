"""Which rank of which job this process is, read from its launcher's environment variables.

Pure and import-light (``os`` and dataclasses only): every rank reads it at job start. The probe
uses it to let one rank probe while the others wait for its lock
(``kernel_probe.jobstart.handoff``).

Launchers, innermost first (the one that started *this* process wins: torchrun inside ``srun`` gives
one Slurm task per node but one torchrun rank per GPU), with their documentation:

- torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK`` (node), ``TORCHELASTIC_RUN_ID``
  (the rendezvous id; ``none`` unless ``--rdzv-id`` or ``--standalone``),
  ``TORCHELASTIC_RESTART_COUNT`` (https://docs.pytorch.org/docs/stable/elastic/run.html,
  "Environment Variables")
- Open MPI: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``
  (``OMPI_COMM_WORLD_NODE_RANK`` counts across *all* jobs on the node, so it is not used); the job
  is the PMIx namespace ``PMIX_NAMESPACE`` or ORTE's ``OMPI_MCA_ess_base_jobid``
  (https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html)
- HPE Cray PALS: ``PALS_RANKID``, ``PALS_LOCAL_RANKID``, ``PALS_NODEID``, ``PALS_APID`` (the
  application id; flux-coral2 doc/man1/flux-shell-cray-pals.rst lists the variables cray-pals sets)
- PMI (MPICH Hydra, Intel MPI, Cray PMI, ``srun --mpi=pmi2``): ``PMI_RANK``, ``PMI_SIZE``,
  ``PMI_LOCAL_RANK`` or Hydra's ``MPI_LOCALRANKID``; PMI names no job, so the batch system's is used
- Slurm: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_JOB_ID``
  with ``SLURM_STEP_ID`` (two ``srun`` steps of one job are two launches), ``SLURM_RESTART_COUNT``
  (a requeued job keeps its id: the attempt tells them apart) (https://slurm.schedmd.com/srun.html
  and sbatch.html, "OUTPUT ENVIRONMENT VARIABLES")

A launcher counts when its rank variable is set. Its other variables are then read as follows, and
nothing is guessed that could make two ranks probe:

- a value that is not a whole number, or a rank not below the world size: a usage error (exit 2)
  naming the variable; never read as rank 0;
- its local rank or node missing: fine (each rank then watches the shared directory itself);
- its job id missing (or torchrun's ``none``): the batch system's (``SLURM_JOB_ID``, ``PBS_JOBID``,
  ``FLUX_JOB_ID``); none at all: no rank is known (``Detection.rank`` is None, ``notes`` says why)
  and the probe keeps its file-lock behaviour, where one rank probes as long as the file system does
  file locks. The same when only a launcher's other variables are set (``LOCAL_RANK`` without
  ``RANK``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launcher:
    """Where one launcher keeps a rank's facts (variable names; empty: it does not say)."""

    name: str
    rank: str
    size: tuple[str, ...] = ()
    local_rank: tuple[str, ...] = ()
    node: tuple[str, ...] = ()
    job: tuple[str, ...] = ()
    step: tuple[str, ...] = ()
    attempt: tuple[str, ...] = ()


LAUNCHERS = (
    Launcher(
        "torchrun",
        "RANK",
        ("WORLD_SIZE",),
        ("LOCAL_RANK",),
        ("GROUP_RANK",),
        ("TORCHELASTIC_RUN_ID",),
        attempt=("TORCHELASTIC_RESTART_COUNT",),
    ),
    Launcher(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        ("OMPI_COMM_WORLD_SIZE",),
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        (),
        ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"),
    ),
    Launcher(
        "pals",
        "PALS_RANKID",
        ("PMI_SIZE",),
        ("PALS_LOCAL_RANKID",),
        ("PALS_NODEID",),
        ("PALS_APID",),
    ),
    Launcher("pmi", "PMI_RANK", ("PMI_SIZE",), ("PMI_LOCAL_RANK", "MPI_LOCALRANKID")),
    Launcher(
        "slurm",
        "SLURM_PROCID",
        ("SLURM_NTASKS", "SLURM_NPROCS"),
        ("SLURM_LOCALID",),
        ("SLURM_NODEID",),
        ("SLURM_JOB_ID", "SLURM_JOBID"),
        ("SLURM_STEP_ID", "SLURM_STEPID"),
        ("SLURM_RESTART_COUNT",),
    ),
)
# the batch system's job, for a launcher that names none (PMI, torchrun without --rdzv-id)
BATCH_JOB = (
    ("SLURM_JOB_ID", ("SLURM_STEP_ID",), ("SLURM_RESTART_COUNT",)),
    ("PBS_JOBID", (), ()),
    ("FLUX_JOB_ID", (), ()),
)
BATCH_STEP = ("SLURM_STEP_ID", "SLURM_STEPID")
BATCH_ATTEMPT = ("SLURM_RESTART_COUNT",)
NO_JOB = {"", "none"}  # torchrun's default --rdzv-id


class RankVariableError(ValueError):
    """A launcher variable that cannot be read as what it names (the CLI makes it a usage error,
    exit 2)."""


@dataclass(frozen=True)
class JobRank:
    """This process's place in its job. ``local_rank``/``node``/``world_size`` are None when the
    launcher does not say; ``job`` (with the launch step) and ``attempt`` identify this start of the
    job."""

    launcher: str
    rank: int
    job: str
    attempt: str = "0"
    world_size: int | None = None
    local_rank: int | None = None
    node: int | None = None
    variables: tuple[str, ...] = ()  # the variables read, for messages

    @property
    def key(self) -> str:
        """This start of the job, safe in a file name: ``slurm-1234.0-a0``."""
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", f"{self.launcher}-{self.job}-a{self.attempt}")[
            :120
        ]

    @property
    def node_leader(self) -> bool:
        """Whether this rank watches the shared directory for its node (local rank 0, or not
        known)."""
        return self.local_rank in (None, 0)

    def describe(self) -> str:
        """This rank in words: rank, world size, node, local rank, launcher, job and attempt."""
        size = f" of {self.world_size}" if self.world_size is not None else ""
        where = f", node {self.node}" if self.node is not None else ""
        local = f", local rank {self.local_rank}" if self.local_rank is not None else ""
        return (
            f"rank {self.rank}{size}{where}{local} of {self.launcher} job {self.job} "
            f"(attempt {self.attempt})"
        )


@dataclass(frozen=True)
class Detection:
    """What the launcher variables say: this process's rank (None when none is known), with notes on
    them."""

    rank: JobRank | None
    notes: tuple[str, ...] = ()


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None


def _whole(name: str, value: str) -> int:
    # ASCII digits only: str.isdigit takes '²' and '٣', which int() then refuses or reads otherwise
    if not re.fullmatch(r"[0-9]{1,9}", value):
        raise RankVariableError(
            f"{name}={value!r} is not a whole number >= 0, so this process's rank is unknown"
        )
    return int(value)


def _number(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    found = _first(env, names)
    return _whole(*found) if found else None


def _job(env: Mapping[str, str], spec: Launcher) -> tuple[str, str, list[str]] | None:
    """(job id with its step, attempt, variables read), from the launcher, else the batch system."""
    own = _first(env, spec.job)
    candidates: list[tuple[tuple[str, str], tuple[str, ...], tuple[str, ...]]] = []
    if own and own[1].lower() not in NO_JOB:
        candidates.append((own, spec.step, spec.attempt))
    for batch_name, batch_step, batch_attempt in BATCH_JOB:
        found = _first(env, (batch_name,))
        if found:
            candidates.append((found, batch_step, batch_attempt))
    if not candidates:
        return None
    (name, job), step_names, attempt_names = candidates[0]
    used = [name]
    # the launch step, the launcher's or else the batch system's: torchrun's --rdzv-id=$SLURM_JOB_ID
    # is the same in every `srun` step of the job, and two steps are two launches
    step_found = _first(env, step_names)
    requeues: tuple[str, ...] = ()
    # under Slurm: its step, and its requeues too
    if step_found is None and _first(env, BATCH_STEP):
        step_found, requeues = _first(env, BATCH_STEP), BATCH_ATTEMPT
    if step_found:
        job, used = f"{job}.{step_found[1]}", used + [step_found[0]]
    counts = []
    # Slurm's requeues, torchrun's restarts
    for names in dict.fromkeys(n for n in (requeues, attempt_names, spec.attempt) if n):
        found = _first(env, names)  # not set: the first attempt (Slurm sets it only on a requeue)
        counts.append(str(_whole(*found)) if found else "0")
        used += [found[0]] if found else []
    return job, ".".join(counts) or "0", used


def detect(env: Mapping[str, str] | None = None) -> Detection:
    """This process's rank, from the innermost launcher whose rank variable is set. Raises
    :class:`RankVariableError` for a value that is set but not a rank (never read as rank 0)."""
    env = os.environ if env is None else env
    notes: list[str] = []
    for spec in LAUNCHERS:
        found = _first(env, (spec.rank,))
        if found is None:
            others = [n for n in (*spec.size, *spec.local_rank) if n in env]
            if others:
                notes.append(
                    f"{', '.join(others)} set without {spec.rank}: not read as a {spec.name} rank"
                )
            continue
        rank = _whole(*found)
        size = _number(env, spec.size)
        if size is not None and rank >= size:
            raise RankVariableError(
                f"{spec.rank}={rank} is not below the world size {size}: contradictory"
            )
        local, node = _number(env, spec.local_rank), _number(env, spec.node)
        job = _job(env, spec)
        if job is None:
            names = ", ".join((*spec.job, *(b[0] for b in BATCH_JOB)))
            notes.append(
                f"{spec.rank} is set but no job id is ({names}), so a lock from another job could "
                "not be told apart: ranks are not coordinated, each takes the file lock"
            )
            return Detection(None, tuple(notes))
        job_id, attempt, used = job
        read = tuple(
            n for n in (spec.rank, *spec.size, *spec.local_rank, *spec.node) if n in env
        ) + tuple(used)
        return Detection(
            JobRank(spec.name, rank, job_id, attempt, size, local, node, read), tuple(notes)
        )
    return Detection(None, tuple(notes))
