"""Rank detection from launcher variables (kernel_probe.ranks): every launcher, the nesting
of one launcher in another, and what partial or contradictory variables decide (never a guessed rank
0)."""

from __future__ import annotations

import pytest

from kernel_probe.ranks import JobRank, RankVariableError, detect

SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "13",
    "SLURM_LOCALID": "5",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "16",
}
TORCHRUN = {
    "RANK": "9",
    "WORLD_SIZE": "16",
    "LOCAL_RANK": "1",
    "GROUP_RANK": "2",
    "LOCAL_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "exp7",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_COMM_WORLD_NODE_RANK": "7",  # across all jobs on the node: not a node index, not read
    "PMIX_NAMESPACE": "prterun-host-1234@1",
}
PALS = {
    "PALS_RANKID": "6",
    "PALS_LOCAL_RANKID": "2",
    "PALS_NODEID": "1",
    "PALS_APID": "8762756694016",
}
HYDRA = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "PBS_JOBID": "991.pbs01"}
CRAY_PMI = {"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "0", "SLURM_JOB_ID": "55"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (SLURM, JobRank("slurm", 13, "4242.0", "0", 16, 5, 1)),
        ({**SLURM, "SLURM_RESTART_COUNT": "3"}, JobRank("slurm", 13, "4242.0", "3", 16, 5, 1)),
        (TORCHRUN, JobRank("torchrun", 9, "exp7", "2", 16, 1, 2)),
        (
            {**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": ""},
            JobRank("torchrun", 9, "exp7", "0", 16, 1, 2),
        ),
        (OPENMPI, JobRank("openmpi", 3, "prterun-host-1234@1", "0", 8, 3, None)),
        ({**PALS, "PMI_SIZE": "12"}, JobRank("pals", 6, "8762756694016", "0", 12, 2, 1)),
        (PALS, JobRank("pals", 6, "8762756694016", "0", None, 2, 1)),
        (HYDRA, JobRank("pmi", 5, "991.pbs01", "0", 8, 1, None)),
        (CRAY_PMI, JobRank("pmi", 5, "55", "0", 8, 0, None)),
        # torchrun inside srun: the process is torchrun's rank (Slurm's is the node's one task)
        (
            {**SLURM, "SLURM_PROCID": "1", "SLURM_NTASKS": "4", **TORCHRUN},
            JobRank("torchrun", 9, "exp7.0", "0.2", 16, 1, 2),
        ),
        # torchrun without --rdzv-id ("none"): the batch system's job; its requeues and torchrun's
        # restarts
        (
            {**SLURM, "SLURM_RESTART_COUNT": "1", **TORCHRUN, "TORCHELASTIC_RUN_ID": "none"},
            JobRank("torchrun", 9, "4242.0", "1.2", 16, 1, 2),
        ),
        # srun --mpi=pmi2: PMI and Slurm agree; PMI, the inner one, is read, with Slurm's job
        (
            {**SLURM, "PMI_RANK": "13", "PMI_SIZE": "16"},
            JobRank("pmi", 13, "4242.0", "0", 16, None, None),
        ),
    ],
    ids=[
        "slurm",
        "slurm-requeued",
        "torchrun",
        "torchrun-first-attempt",
        "openmpi",
        "pals",
        "pals-no-size",
        "hydra",
        "cray-pmi",
        "torchrun-in-srun",
        "torchrun-no-rdzv-id",
        "srun-pmi2",
    ],
)
def test_every_launcher(env, expected):
    found = detect(env)
    assert found.rank is not None
    got = found.rank
    assert (
        got.launcher,
        got.rank,
        got.job,
        got.attempt,
        got.world_size,
        got.local_rank,
        got.node,
    ) == (
        expected.launcher,
        expected.rank,
        expected.job,
        expected.attempt,
        expected.world_size,
        expected.local_rank,
        expected.node,
    )
    assert got.node_leader is (got.local_rank in (None, 0))
    assert str(got.rank) in got.describe() and got.job in got.describe()


def test_no_launcher_is_no_rank_and_nothing_to_say():
    assert detect({"HOME": "/root", "TMPDIR": "/tmp"}) == detect({})
    assert detect({}).rank is None and detect({}).notes == ()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"LOCAL_RANK": "0", "WORLD_SIZE": "4"}, "WORLD_SIZE, LOCAL_RANK set without RANK"),
        ({"OMPI_COMM_WORLD_SIZE": "4"}, "without OMPI_COMM_WORLD_RANK"),
        # a rank but no job: a marker could not tell this job from the last one
        ({"RANK": "0", "WORLD_SIZE": "2"}, "no job id"),
        ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, "no job id"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, "no job id"),
    ],
)
def test_partial_variables_leave_the_ranks_uncoordinated_and_say_why(env, said):
    found = detect(env)
    assert found.rank is None
    assert any(said in note for note in found.notes), found.notes


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({**SLURM, "SLURM_PROCID": "x1"}, "SLURM_PROCID='x1' is not a whole number"),
        ({**SLURM, "SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is not a whole number"),
        ({**SLURM, "SLURM_PROCID": "16"}, "SLURM_PROCID=16 is not below the world size 16"),
        ({**SLURM, "SLURM_LOCALID": "one"}, "SLURM_LOCALID='one'"),
        ({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "?"}, "TORCHELASTIC_RESTART_COUNT='?'"),
    ],
)
def test_a_value_that_is_not_a_rank_is_an_error_never_rank_0(env, said):
    with pytest.raises(RankVariableError, match=said.replace("?", r"\?")):
        detect(env)


def test_the_job_key_tells_jobs_steps_and_attempts_apart_and_is_a_file_name():
    def key(env):
        found = detect(env).rank
        assert found is not None
        return found.key

    keys = {
        key(SLURM),
        key({**SLURM, "SLURM_JOB_ID": "4243"}),
        key({**SLURM, "SLURM_STEP_ID": "1"}),
        key({**SLURM, "SLURM_RESTART_COUNT": "1"}),
        key(
            {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", **SLURM, "TORCHELASTIC_RESTART_COUNT": "1"}
        ),
        key({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", **SLURM, "SLURM_RESTART_COUNT": "1"}),
        # a requeue (Slurm 1, torchrun 0) is not the first attempt's first torchrun restart (Slurm
        # 0, torchrun 1)
        key(
            {
                **TORCHRUN,
                "TORCHELASTIC_RUN_ID": "none",
                **SLURM,
                "SLURM_RESTART_COUNT": "1",
                "TORCHELASTIC_RESTART_COUNT": "0",
            }
        ),
    }
    assert len(keys) == 7
    # torchrun's own --rdzv-id=$SLURM_JOB_ID is the same in every srun step and after a requeue
    # (issue 34)
    rdzv = {**TORCHRUN, **SLURM, "TORCHELASTIC_RUN_ID": "4242"}
    steps = {
        key(rdzv),
        key({**rdzv, "SLURM_STEP_ID": "1"}),
        key({**rdzv, "SLURM_RESTART_COUNT": "1"}),
    }
    assert len(steps) == 3
    hostile = key({**PALS, "PALS_APID": "../../etc/passwd x"})
    assert "/" not in hostile and " " not in hostile


@pytest.mark.parametrize("value", ["²", "٣", "1e3", "0x1", "-1", "1" * 12])
def test_a_rank_in_other_digits_is_a_usage_error_not_a_crash(value):
    """``str.isdigit`` takes '²', which int() refuses: once an unexpected ValueError (exit 1) (issue
    34)."""
    with pytest.raises(RankVariableError, match="not a whole number"):
        detect({"RANK": value, "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"})
