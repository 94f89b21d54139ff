"""kernel_lock.errors: the error family, its rendering (where, what, fix) and the exit codes."""

from __future__ import annotations

import pytest

from kernel_lock import errors


def test_exit_codes():
    assert [int(c) for c in errors.ExitCode] == [0, 1, 2, 3, 4, 5, 6]
    assert (
        errors.EXIT_CODES[0] == "ok"
        and errors.EXIT_CODES[4] == "the machine does not meet the site profile"
    )
    assert {int(c): c.meaning for c in errors.ExitCode} == errors.EXIT_CODES
    assert (
        str(errors.ExitCode.BAD_INPUT) == "5"
        and f"{errors.ExitCode.MISMATCH}" == "3"
        and errors.ExitCode.USAGE == 2
    )
    assert (
        errors.ExitCode(6) is errors.ExitCode.LOCKS_DIFFER
        and "--exit-code" in errors.ExitCode.LOCKS_DIFFER.meaning
    )


@pytest.mark.parametrize(
    "cls,code,bases",
    [
        (errors.LockError, 1, (Exception,)),
        (errors.LockFormatError, 5, (errors.LockError, ValueError)),
        (errors.LockVersionError, 5, (errors.LockFormatError,)),
        (errors.TargetNotAllowed, 5, (errors.LockFormatError,)),
        (errors.LockMismatch, 3, (errors.LockError,)),
        (errors.KernelUnavailable, 3, (errors.LockError,)),
        (errors.RanksDisagree, 3, (errors.LockError,)),
        (errors.DeviceVisibilityError, 2, (errors.LockError,)),
        (errors.BadEnvironmentVariable, 2, (errors.LockError, ValueError)),
    ],
)
def test_each_error_has_its_exit_code(cls, code, bases):
    assert cls.exit_code == code and issubclass(cls, bases)


@pytest.mark.parametrize(
    "path,key,fix,text",
    [
        (None, None, None, "broken"),
        ("k.toml", None, None, "k.toml: broken"),
        (None, "slots.Linear", None, "'slots.Linear': broken"),
        ("k.toml", "slots.Linear", None, "k.toml: 'slots.Linear': broken"),
        ("k.toml", "digest", "rehash it", "k.toml: 'digest': broken\n  fix: rehash it"),
        (None, None, "rehash it", "broken\n  fix: rehash it"),
    ],
)
def test_an_error_names_where_what_and_the_fix(path, key, fix, text):
    exc = errors.LockFormatError("broken", path=path, key=key, fix=fix)
    assert str(exc) == text
    assert (exc.path, exc.key, exc.problem, exc.fix) == (path, key, "broken", fix)


@pytest.mark.parametrize(
    "diff,text",
    [
        (
            errors.Difference("torch", "2.6.0", "2.7.1", "compatible"),
            "torch: lock has '2.6.0', this machine has '2.7.1' (match = compatible)",
        ),
        (
            errors.Difference("device-count", 8, 4, "exact"),
            "device-count: lock has 8, this machine has 4 (match = exact)",
        ),
    ],
)
def test_difference_text(diff, text):
    assert str(diff) == text


def test_lock_mismatch_lists_every_difference():
    diffs = [
        errors.Difference("torch", "2.6", "2.7", "compatible"),
        errors.Difference("arch", "x86_64", "aarch64", "exact"),
    ]
    exc = errors.LockMismatch(diffs, path="k.toml")
    assert exc.differences == diffs and exc.key == "environment" and exc.exit_code == 3
    text = str(exc)
    assert text.startswith(
        "k.toml: 'environment': the environment does not match the lock (2 field(s)):"
    )
    assert "\n  - torch: lock has '2.6'" in text and "\n  - arch: lock has 'x86_64'" in text
    assert "kernel-probe --force" in exc.fix
    assert errors.LockMismatch([], fix="do this").fix == "do this"


def test_ranks_disagree_keeps_the_reports():
    exc = errors.RanksDisagree(
        "ranks 1, 3 differ", reports=[{"rank": 1}], ranks=[1, 3], fix="same lock everywhere"
    )
    assert exc.reports == [{"rank": 1}] and exc.ranks == [1, 3]
    assert (
        str(exc) == "ranks 1, 3 differ\n  fix: same lock everywhere"
        and exc.path is None
        and exc.key is None
    )
    assert errors.RanksDisagree("x").reports == [] and errors.RanksDisagree("x").ranks == []


def test_lock_warning_is_a_user_warning():
    assert issubclass(errors.LockWarning, UserWarning) and not issubclass(
        errors.LockWarning, errors.LockError
    )


def test_the_package_exports_the_family():
    import kernel_lock

    for name in (
        "LockError",
        "LockFormatError",
        "LockVersionError",
        "TargetNotAllowed",
        "LockMismatch",
        "LockWarning",
    ):
        assert getattr(kernel_lock, name) is getattr(errors, name)
