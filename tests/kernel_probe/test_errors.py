"""kernel_probe.errors: the probe's error family, each class with the exit code the CLI returns for
it."""

from __future__ import annotations

import pytest

from kernel_lock.errors import ExitCode, LockError
from kernel_probe import errors
from kernel_probe.tables import CandidateDataError

CODES = [
    (errors.ProbeError, ExitCode.FAILURE),
    (errors.UsageError, ExitCode.USAGE),
    (errors.StaleLock, ExitCode.MISMATCH),
    (errors.ForcedUnusable, ExitCode.MISMATCH),
    (errors.TooLarge, ExitCode.MISMATCH),
    (errors.NodeDiffers, ExitCode.MISMATCH),
    (errors.ProfileUnmet, ExitCode.PROFILE_UNMET),
    (errors.InputFileError, ExitCode.BAD_INPUT),
    (CandidateDataError, ExitCode.BAD_INPUT),  # kernel_probe.tables' error is an input-file error
]


@pytest.mark.parametrize("cls, code", CODES, ids=[cls.__name__ for cls, _ in CODES])
def test_each_error_has_its_exit_code(cls, code):
    exc = cls("something is wrong")
    assert exc.exit_code == code and isinstance(exc.exit_code, ExitCode)
    # a class attribute: the CLI reads it without an instance
    assert type(cls.exit_code) is ExitCode


@pytest.mark.parametrize("cls", [cls for cls, _ in CODES], ids=[cls.__name__ for cls, _ in CODES])
def test_every_error_is_a_probe_error_and_a_lock_error(cls):
    """The CLI catches LockError (kernel_lock's and the probe's) and maps it to its exit code."""
    assert issubclass(cls, errors.ProbeError) and issubclass(cls, LockError)


def test_every_probe_error_class_is_listed_here():
    def subclasses(cls):
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    ours = {
        c
        for c in subclasses(errors.ProbeError)
        if c.__module__ in ("kernel_probe.errors", "kernel_probe.tables")
    }
    assert ours == {cls for cls, _ in CODES}


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({}, "no candidate accepted"),
        ({"path": "lock.toml"}, "lock.toml: no candidate accepted"),
        ({"key": "slots.Linear"}, "'slots.Linear': no candidate accepted"),
        (
            {"path": "lock.toml", "key": "slots.Linear"},
            "lock.toml: 'slots.Linear': no candidate accepted",
        ),
        ({"fix": "run kernel-probe"}, "no candidate accepted\n  fix: run kernel-probe"),
        (
            {"path": "p.toml", "key": "k", "fix": "f"},
            "p.toml: 'k': no candidate accepted\n  fix: f",
        ),
    ],
)
def test_message_names_file_key_and_fix(kwargs, text):
    exc = errors.InputFileError("no candidate accepted", **kwargs)
    assert str(exc) == text
    assert exc.problem == "no candidate accepted"
    assert (exc.path, exc.key, exc.fix) == (
        kwargs.get("path"),
        kwargs.get("key"),
        kwargs.get("fix"),
    )
