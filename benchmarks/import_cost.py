"""Cost of `import kernel_lock` + load + verify + resolve, next to `import torch` alone.

Goal (issue 2): under 50 ms extra. Both are measured in this one run, interleaved, as the median of
fresh interpreter starts, so machine noise hits both alike. Prints figures; asserts nothing.

Bytecode (issue 38): an installed wheel carries its ``.pyc`` files; an editable install in an
environment with ``PYTHONDONTWRITEBYTECODE=1`` (these machines set it) has none, so every start
compiles every kernel_lock module it imports from source. The children here may write their
bytecode (``__pycache__``, ignored by git), as an install has it, and the figure without bytecode is
printed beside: the compile time of the kernel_lock modules the path imports, measured in the same
process.

    python benchmarks/import_cost.py [--runs 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_lock import launch  # noqa: E402  (this checkout's, found through ROOT)
from kernel_lock.launch import python_argv  # noqa: E402

ENV = dict(os.environ)


def child(code: str) -> str:
    """Run ``code`` in a fresh interpreter started by the one launcher (``kernel_lock.launch``:
    ``-I``, this checkout first on its path, its own session, in this checkout); its stdout."""
    done = launch.run(python_argv(code, roots=[str(ROOT)]), cwd=ROOT, env=ENV)
    if done.returncode:
        raise SystemExit(
            f"the child running {code.splitlines()[0]!r} exited {done.returncode}:\n"
            f"{done.stderr[-2000:]}"
        )
    return done.stdout


def wall(code: str) -> float:
    t = time.perf_counter()
    child(code)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        path = Path(d) / "kernel-lock.toml"
        # a real lock for this machine (one cold probe, not timed): verify checks its whole
        # fingerprint
        probe = [sys.executable, "-m", "kernel_probe", "--out", str(path)]
        launch.run(
            [*probe, "--timeout", "300", "--import-timeout", "300"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).check_returncode()
        cases = {
            "import torch": "import torch",
            "import kernel_lock (no torch)": "import kernel_lock",
            "import torch + kernel_lock + load + verify + resolve every slot": (
                "import torch, kernel_lock\nlock = "
                f"kernel_lock.load({str(path)!r})\nlock.verify()\n[lock.factory(s) for s in "
                "lock.slots]"
            ),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for code in cases.values():
            wall(code)  # warm the page cache once
        for _ in range(args.runs):
            for name, code in cases.items():
                times[name].append(wall(code))
        # in-process split (less noisy than the difference of two interpreter starts)
        split_code = (
            "import time, json; import torch\nt0 = time.perf_counter(); import kernel_lock; t1 = "
            f"time.perf_counter()\nlock = kernel_lock.load({str(path)!r}); t2 = "
            "time.perf_counter()\nlock.verify(); t3 = "
            "time.perf_counter()\n[lock.factory(s)(*{'LayerNorm': (8,), 'RMSNorm': (8,), "
            "'Linear': (8, 8), 'GatedMLP': (8, 8)}.get(s, ())) for s in lock.slots]; t4 = "
            "time.perf_counter()\nimport sys\nfiles = [m.__file__ for n, m in "
            "list(sys.modules.items()) if n.split('.')[0] == 'kernel_lock' and getattr(m, "
            "'__file__', None)]\nt5 = time.perf_counter()\n[compile(open(f, "
            "encoding='utf-8').read(), f, 'exec') for f in files]\nprint(json.dumps([t1 - t0, t2 "
            "- t1, t3 - t2, t4 - t3, time.perf_counter() - t5, len(files)]))"
        )
        import json

        splits = []
        for _ in range(args.runs):
            splits.append(json.loads(child(split_code)))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["import torch"]
    print(f"runs per case: {args.runs} (median wall time of a fresh interpreter)")
    for name, t in med.items():
        print(f"  {name:<62} {t * 1000:8.1f} ms   ratio to import torch {t / base:5.3f}")
    extra = (med["import torch + kernel_lock + load + verify + resolve every slot"] - base) * 1000
    print(f"extra over `import torch` (difference of medians, noisy): {extra:.1f} ms")
    names = ["import kernel_lock", "load", "verify (fingerprint)", "resolve + build every slot"]
    parts = [statistics.median(s[i] for s in splits) * 1000 for i in range(4)]
    for n, v in zip(names, parts, strict=True):
        print(f"  in-process, torch already imported: {n:<26} {v:7.2f} ms")
    print(
        f"in-process total extra: {sum(parts):.1f} ms (goal: under 50 ms); ratio to import torch: "
        f"{1 + sum(parts) / 1000 / base:.3f}"
    )
    compiling = statistics.median(s[4] for s in splits) * 1000
    print(
        "without bytecode (PYTHONDONTWRITEBYTECODE=1, no __pycache__: an editable install on "
        f"these machines) add compiling the {int(splits[0][5])} kernel_lock modules this path "
        f"imports: {compiling:.1f} ms (total {sum(parts) + compiling:.1f} ms)"
    )


if __name__ == "__main__":
    main()
