"""The probe's time limits and the size of its correctness inputs: light (the command line's parser
and a job start's warm path read them without the checker, the worker or torch)."""

from __future__ import annotations

IMPORT_TIMEOUT = 20.0  # seconds an import may take: a library that hangs costs this much
CHECK_TIMEOUT = 30.0  # seconds the checks of one candidate may take once imported
COMPILED_FACTOR = 4  # torch.compile candidates compile on their first calls: 4x the budget
TIMING_TIMEOUT = 600.0  # seconds one candidate's timing at every shape may take
CHECK_HIDDEN = 1000  # the correctness inputs' normalised size: not a power of two on purpose

# every numeric option is finite, positive and at most this (kernel_probe.cli)
MAX_SECONDS = 7 * 24 * 3600.0  # a week: longer than any job's start; beyond it a typo, not a budget
MAX_REPS = 100_000
