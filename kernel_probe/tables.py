"""Strict reading of the project's TOML tables (the registry, site profiles, candidate
declarations): ``kernel_lock.tables``'s typed getters, their errors the probe's input-file
errors (exit 5) naming the file and the dotted key; unknown keys refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from kernel_lock.tables import (
    ReadError,
    did_you_mean,
    get,
    get_required,
    get_strings,
    unknown_keys,
)
from kernel_probe.errors import InputFileError

_T = TypeVar("_T")
Table = Mapping[str, Any]  # a parsed TOML table


class CandidateDataError(InputFileError):
    """A malformed candidate data file (exit 5); the message names the file and the dotted key."""


class TableReader:
    """Strict reading of parsed TOML, its errors ``error`` (a site profile's: ``ProfileError``).
    Unknown keys are errors: a typo must not widen a policy or drop a pinned argument."""

    error: type[InputFileError] = CandidateDataError

    def __init__(self, path: str):
        self.path = path

    def err(self, key: str, problem: str, fix: str | None = None) -> InputFileError:
        """The reader's error for ``key``, naming the file and the fix."""
        return self.error(problem, path=self.path, key=key, fix=fix)

    def read(self, where: str, getter: Callable[[], _T]) -> _T:
        """A ``kernel_lock.tables`` getter, its error this reader's (the key after ``where``)."""
        try:
            return getter()
        except ReadError as exc:
            raise self.err(f"{where}{exc.key}", exc.problem, exc.fix) from None

    def table(self, d: Table, key: str, known: Sequence[str], where: str) -> dict[str, Any]:
        """The sub-table ``key`` of ``d``, its unknown keys refused."""
        v = self.free_table(d, key, where)
        self.no_unknown(v, known, f"{where}{key}.")
        return v

    def free_table(self, d: Table, key: str, where: str) -> dict[str, Any]:
        """A table whose keys are the user's (variables, paths, library names)."""
        return self.read(where, lambda: get(d, key, dict, default={}))

    def no_unknown(self, d: Table, known: Sequence[str], where: str) -> None:
        """Refuse the first key of ``d`` not in ``known``, with a did-you-mean."""
        for k in unknown_keys(d, known):
            hint = did_you_mean(k, known, "known keys here")
            raise self.err(f"{where}{k}", f"unknown key {k!r}", fix=hint)

    # a required key, or one with a string default, is never None
    @overload
    def string(self, d: Table, key: str, where: str, required: Literal[True]) -> str: ...
    @overload
    def string(
        self, d: Table, key: str, where: str, required: bool = ..., *, default: str
    ) -> str: ...
    @overload
    def string(
        self, d: Table, key: str, where: str, required: bool = ..., default: str | None = ...
    ) -> str | None: ...

    def string(
        self, d: Table, key: str, where: str, required: bool = False, default: str | None = None
    ) -> str | None:
        """The string at ``key`` (or ``default``; ``required``: an error when absent)."""
        if required:
            return self.read(where, lambda: get_required(d, key, str))
        return self.read(where, lambda: get(d, key, str, default))

    def strings(self, d, key, where) -> tuple[str, ...]:
        """A list of strings; a lone string is a list of one."""
        v = d.get(key)
        return (v,) if isinstance(v, str) else self.read(where, lambda: get_strings(d, key))

    def boolean(self, d, key, where, default: bool = False) -> bool:
        """The boolean at ``key``, or ``default``."""
        return self.read(where, lambda: get(d, key, bool, default))

    def regex(self, pattern: str, key: str) -> str:
        """``pattern`` when it compiles as a regular expression, else an error naming ``key``."""
        try:
            re.compile(pattern)
        except re.error as exc:
            raise self.err(key, f"{pattern!r} is not a valid regular expression: {exc}") from None
        return pattern

    def specifier(self, spec: Any, key: str) -> str:
        """``spec`` when it is a PEP 440 version specifier string, else an error naming ``key``."""
        from packaging.specifiers import InvalidSpecifier, SpecifierSet  # not on the warm path

        if not isinstance(spec, str):
            raise self.err(key, f"expected a PEP 440 specifier string, got {type(spec).__name__}")
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            problem = f"{spec!r} is not a PEP 440 version specifier like '>=2.4,<2.12'"
            raise self.err(key, problem) from None
        return spec
