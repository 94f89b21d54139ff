"""The site signals a profile's ``[detect]`` table may name, and the bound on their patterns.

A strong signal names the site itself (a site's own environment variable or marker file, the Slurm
cluster name); a weak one follows a naming scheme other sites share (HPE Cray EX nodes are all
nidNNNNNN; "gpu" or "small-g" partitions exist anywhere): it never decides alone, only together with
a strong one or with the other weak kind in a [[detect.all]] group. The device describes hardware,
not a site: alone, it only picks a device profile (one with no site signal, like the built-in cpu).
See docs/profiles.md "Auto-detection"; ``kernel_probe.profiles.autodetect`` matches the signals.
"""

from __future__ import annotations

from typing import Any

STRONG = {"env": 3, "files": 3, "slurm-cluster": 2}
WEAK = ("hostname", "slurm-partition")
SIGNALS = (*STRONG, *WEAK, "device")
DETECT_DEVICE_KEYS = ("type", "vendor", "arch")
MAX_SIGNAL_CHARS = 256  # a longer value never matches: it bounds every pattern's matching time
MAX_VARIABLE_REPEATS = 2  # per pattern; with MAX_SIGNAL_CHARS, a search stays within milliseconds


def pattern_problem(pattern: str) -> str | None:
    """Why a detect pattern could backtrack without bound (None if it cannot).

    Refused: a repeat inside a repeat, an alternation inside a repeat (``(a|aa)+``), a
    backreference, more than MAX_VARIABLE_REPEATS variable repeats. What remains, on a value of at
    most MAX_SIGNAL_CHARS, matches in a few milliseconds. The tree is the one ``re`` itself
    compiles."""
    import importlib

    # the stdlib's own parser (re._parser since 3.11, sre_parse before): the tree re compiles
    try:
        sre, c = importlib.import_module("re._parser"), importlib.import_module("re._constants")
    except ImportError:  # Python 3.10
        sre, c = importlib.import_module("sre_parse"), importlib.import_module("sre_constants")

    repeats = tuple(
        getattr(c, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(c, n)
    )
    counted = 0

    def walk(items: Any, in_repeat: bool) -> str | None:
        nonlocal counted
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                variable = hi != lo and hi > 1
                if in_repeat and variable:
                    return "a repeat inside a repeat"
                counted += variable
                found = walk(sub, in_repeat or hi > 1)
            elif op is c.BRANCH:
                if in_repeat:
                    return "an alternation inside a repeat"
                found = next((x for x in (walk(b, in_repeat) for b in av[1]) if x), None)
            elif op is c.SUBPATTERN:
                found = walk(av[-1], in_repeat)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                found = walk(av[1], in_repeat)
            elif op in (c.GROUPREF, c.GROUPREF_EXISTS):
                return "a backreference"
            elif op is getattr(c, "ATOMIC_GROUP", None):
                found = walk(av, in_repeat)
            else:
                continue
            if found:
                return found
        return None

    found = walk(sre.parse(pattern), False)
    if found is None and counted > MAX_VARIABLE_REPEATS:
        found = f"{counted} variable repeats (at most {MAX_VARIABLE_REPEATS})"
    return found
