"""Which rank of which job this process is, from its launcher's variables (import-light; launchers
innermost first, docs/probe.md "Who is who"). A value that is not a whole number, or a rank not
below the world size, is an error naming the variable (never rank 0); no job id: no rank."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

# who probes at job start (``--probe-per``, a profile's ``[policy] probe-per``)
PROBE_PER = ("job", "node-type", "rank")


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


def _launcher(spec: str) -> Launcher:
    name, rank, *rest = spec.split()
    return Launcher(name, rank, *(tuple(v.split(",")) if v != "-" else () for v in rest))


# innermost first: torchrun inside srun gives one Slurm task per node but one torchrun rank per GPU
# name, rank, size, local rank, node, job, step, attempt ("-": none, "," between alternatives);
# OMPI_COMM_WORLD_NODE_RANK counts across all jobs on the node: not a node index
LAUNCHERS = tuple(
    _launcher(spec)
    for spec in (
        "torchrun RANK WORLD_SIZE LOCAL_RANK GROUP_RANK TORCHELASTIC_RUN_ID - "
        "TORCHELASTIC_RESTART_COUNT",
        "openmpi OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK - "
        "PMIX_NAMESPACE,OMPI_MCA_ess_base_jobid - -",
        "pals PALS_RANKID PMI_SIZE PALS_LOCAL_RANKID PALS_NODEID PALS_APID - -",
        "pmi PMI_RANK PMI_SIZE PMI_LOCAL_RANK,MPI_LOCALRANKID - - - -",
        "slurm SLURM_PROCID SLURM_NTASKS,SLURM_NPROCS SLURM_LOCALID SLURM_NODEID "
        "SLURM_JOB_ID,SLURM_JOBID SLURM_STEP_ID,SLURM_STEPID SLURM_RESTART_COUNT",
    )
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
    """A launcher variable that cannot be read as what it names (a usage error, exit 2)."""


@dataclass(frozen=True)
class JobRank:
    """This process's place in its job; ``local_rank``/``node``/``world_size`` None when the
    launcher does not say. ``job`` (with the launch step) and ``attempt`` identify this start."""

    launcher: str
    rank: int
    job: str
    attempt: str = "0"
    world_size: int | None = None
    local_rank: int | None = None
    node: int | None = None

    @property
    def key(self) -> str:
        """This start of the job, safe in a file name: ``slurm-1234.0-a0``."""
        key = f"{self.launcher}-{self.job}-a{self.attempt}"
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", key)[:120]

    @property
    def node_leader(self) -> bool:
        """Whether this rank watches the shared directory for its node (local rank 0, unknown)."""
        return self.local_rank in (None, 0)

    def describe(self) -> str:
        """This rank in words: rank, world size, node, local rank, launcher, job and attempt."""
        size = f" of {self.world_size}" if self.world_size is not None else ""
        where = f", node {self.node}" if self.node is not None else ""
        local = f", local rank {self.local_rank}" if self.local_rank is not None else ""
        job = f"{self.launcher} job {self.job} (attempt {self.attempt})"
        return f"rank {self.rank}{size}{where}{local} of {job}"


@dataclass(frozen=True)
class Detection:
    """What the launcher variables say: this process's rank (None when unknown), with notes."""

    rank: JobRank | None
    notes: tuple[str, ...] = ()


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    return next(((n, env[n].strip()) for n in names if (env.get(n) or "").strip()), None)


def _whole(name: str, value: str) -> int:
    # ASCII digits only: str.isdigit takes '²' and '٣', which int() then refuses or reads otherwise
    if not re.fullmatch(r"[0-9]{1,9}", value):
        said = "is not a whole number >= 0, so this process's rank is unknown"
        raise RankVariableError(f"{name}={value!r} {said}")
    return int(value)


def _number(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    found = _first(env, names)
    return _whole(*found) if found else None


def _job(env: Mapping[str, str], spec: Launcher) -> tuple[str, str] | None:
    own = _first(env, spec.job)
    choices = [(own, spec.step, spec.attempt)] if own and own[1].lower() not in NO_JOB else []
    choices += [(found, s, a) for n, s, a in BATCH_JOB if (found := _first(env, (n,)))]
    if not choices:
        return None
    (_, job), step_names, attempt_names = choices[0]
    # the launch step, the launcher's or else Slurm's (with its requeues): torchrun's
    # --rdzv-id=$SLURM_JOB_ID is the same in every `srun` step, and two steps are two launches
    requeues: tuple[str, ...] = ()
    step = _first(env, step_names)
    if step is None and (step := _first(env, BATCH_STEP)):
        requeues = BATCH_ATTEMPT
    if step:
        job = f"{job}.{step[1]}"
    # Slurm's requeues, torchrun's restarts; unset: the first attempt
    counts = [
        str(_number(env, names) or 0)
        for names in dict.fromkeys(n for n in (requeues, attempt_names, spec.attempt) if n)
    ]
    return job, ".".join(counts) or "0"


def detect(env: Mapping[str, str] | None = None) -> Detection:
    """This process's rank, from the innermost launcher whose rank variable is set;
    :class:`RankVariableError` for a value set but not a rank (never read as rank 0)."""
    env = os.environ if env is None else env
    notes: list[str] = []
    for spec in LAUNCHERS:
        found = _first(env, (spec.rank,))
        if found is None:
            if others := ", ".join(n for n in (*spec.size, *spec.local_rank) if n in env):
                notes.append(f"{others} set without {spec.rank}: not read as a {spec.name} rank")
            continue
        rank, size = _whole(*found), _number(env, spec.size)
        if size is not None and rank >= size:
            said = f"is not below the world size {size}: contradictory"
            raise RankVariableError(f"{spec.rank}={rank} {said}")
        local, node = _number(env, spec.local_rank), _number(env, spec.node)
        job = _job(env, spec)
        if job is None:
            names = ", ".join((*spec.job, *(b[0] for b in BATCH_JOB)))
            notes.append(
                f"{spec.rank} is set but no job id is ({names}), so a lock from another job could "
                "not be told apart: ranks are not coordinated, each takes the file lock"
            )
            return Detection(None, tuple(notes))
        return Detection(JobRank(spec.name, rank, *job, size, local, node), tuple(notes))
    return Detection(None, tuple(notes))
