"""The import checks' answers, kept per node and per installation so ``env`` need not ask again.

An import check starts a fresh interpreter per library; a library such as liger-kernel pulls in
``torch._dynamo`` and takes 4 s or more to import on a 2-core machine, every time. Its answer only
changes when something it depends on changes, so an answer is kept and reused while all of these
are the same as when it was asked (the cache key):

- the module and the probe asked for, kernel-probe's version and the child's source;
- the interpreter (``sys.executable``, its version, ``sys.prefix``) and the node (host name and boot
  id: a home directory shared by many nodes never answers for another node, or across a reboot);
- the search path: each folder on ``sys.path`` (and the extra paths) with its modification time,
  which changes when a package is installed or removed there, and every file and folder of the
  library's own top-level package with its size and modification time (an edited or replaced file is
  seen);
- the environment variables that steer an import or a device (``PYTHONPATH``, ``LD_LIBRARY_PATH``,
  ``LD_PRELOAD``, and those starting ``CUDA_``, ``HIP_``, ``ROCM_``, ``ROCR_``, ``NVIDIA_``,
  ``TRITON_``, ``TORCH``, ``PYTORCH_``, ``NVTE_``, ``LIGER_``).

Only a clean answer is kept: the child returned (imported, or the import raised), exited with code 0
and printed nothing. A crash, a timeout or a library that printed is asked again next time. An
answer is at most ``MAX_AGE`` old. A reused answer carries ``cached`` (when it was asked) in the
report, so nobody takes it for a fresh check; ``kernel-probe env --fresh`` asks every library again.

The folder is ``$KERNEL_PROBE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernel-probe``, else
``~/.cache/kernel-probe``; answers go to its ``imports/`` folder (mode 0700, checked like the
node-local folders), written by the one safe writer and read by the typed protocol reader. A folder
that cannot be used (read-only home, someone else's) only turns the cache off, with a note.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_lock.files import UnsafeFile, UnsafeWrite, private_dir, read_regular, write_file
from kernel_probe.isolation.child import ChildResult
from kernel_probe.isolation.protocol import (
    ImportCheckCached,
    ImportCheckReply,
    ImportCheckRequest,
    ProtocolError,
)

__all__ = ["FORMAT", "MAX_AGE", "ImportCache", "cache_folder", "cache_key"]

FORMAT = "kernel-probe-import-cache/1"
MAX_AGE = 7 * 24 * 3600.0  # seconds an answer is reused at the most
MAX_BYTES = 256 * 1024  # a cached answer is a few hundred bytes
MAX_ENTRIES = (
    5000  # files of a library's package that are stat'ed for the key (liger-kernel has ~300)
)
ENV_NAMES = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD")
ENV_PREFIXES = (
    "CUDA_",
    "HIP_",
    "ROCM_",
    "ROCR_",
    "NVIDIA_",
    "TRITON_",
    "TORCH",
    "PYTORCH_",
    "NVTE_",
    "LIGER_",
)


def cache_folder(env: Mapping[str, str] | None = None) -> Path:
    """Where the cache lives (see the module's docstring): the folder, not yet checked or made."""
    e = os.environ if env is None else env
    if e.get("KERNEL_PROBE_CACHE_DIR"):
        return Path(e["KERNEL_PROBE_CACHE_DIR"])
    base = Path(e["XDG_CACHE_HOME"]) if e.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "kernel-probe"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _stamp(path: str | os.PathLike[str]) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _package_files(module: str, paths: Sequence[str]) -> Iterator[list[Any]]:
    """Each file and folder of the top-level package ``module`` belongs to, as it is found on
    ``paths``: name, size, modification time (read from the folders; nothing is imported)."""
    top = module.split(".", 1)[0]
    for folder in paths:
        root = Path(folder or ".") / top
        single = Path(folder or ".") / f"{top}.py"
        if root.is_dir():
            seen = 0
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith(".pyc"):
                        continue
                    seen += 1
                    if seen > MAX_ENTRIES:
                        yield ["(more files)", seen]
                        return
                    yield [os.path.join(dirpath, name), _stamp(os.path.join(dirpath, name))]
            return
        if single.is_file():
            yield [str(single), _stamp(single)]
            return


def cache_key(
    request: ImportCheckRequest,
    *,
    child_source: str,
    extra_paths: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> str:
    """The hex digest of everything an import check's answer depends on (the module's docstring)."""
    from kernel_probe import __version__

    e = os.environ if env is None else env
    paths = [str(p) for p in extra_paths] + [p for p in sys.path if p]
    facts = {
        "format": FORMAT,
        "kernel_probe": __version__,
        "child": hashlib.sha256(child_source.encode()).hexdigest(),
        "request": request.to_json(),
        "python": [sys.executable, sys.version, sys.prefix],
        "node": [socket.gethostname(), _boot_id()],
        "paths": [[p, _stamp(p)] for p in paths],
        "package": list(_package_files(request.module, paths)),
        "env": {k: e[k] for k in sorted(e) if k in ENV_NAMES or k.startswith(ENV_PREFIXES)},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


@dataclass
class ImportCache:
    """The cache folder and what happened with it in one run (``used``: answers reused; ``problem``:
    why it is off, for the report's notes)."""

    folder: Path | None
    read: bool = True  # False: ask every library again (``--fresh``); answers are still written
    used: int = 0
    problem: str = ""
    _ready: bool = field(default=False, repr=False)

    @classmethod
    def default(cls, env: Mapping[str, str] | None = None, *, read: bool = True) -> ImportCache:
        """The cache in its usual folder (``cache_folder``)."""
        return cls(cache_folder(env), read=read)

    def _imports(self) -> Path | None:
        if self.folder is None or self.problem:
            return None
        if not self._ready:
            try:
                parent = self.folder.parent
                # ~/.cache on a new account: made private, like the cache itself
                if not parent.exists():
                    private_dir(parent)
                private_dir(self.folder)
                private_dir(self.folder / "imports")
            except (UnsafeWrite, OSError) as exc:
                self.problem = f"the import-check cache is off: {exc}"
                return None
            self._ready = True
        return self.folder / "imports"

    def load(self, key: str) -> tuple[ChildResult, str] | None:
        """The child result kept under ``key`` and when it was asked, or None (missing, stale,
        unreadable)."""
        if not self.read:
            return None
        folder = self._imports()
        if folder is None:
            return None
        path = folder / f"{key}.json"
        try:
            raw = read_regular(path, MAX_BYTES)
            entry = ImportCheckCached.from_json(json.loads(raw))
            # what classify reads: refused here, not misreported
            ImportCheckReply.from_json(entry.reply)
            if not isinstance(entry.asked, (int, float)) or not isinstance(
                entry.seconds, (int, float)
            ):
                return None
            if (
                entry.format != FORMAT
                or entry.key != key
                or not 0 <= time.time() - entry.asked <= MAX_AGE
            ):
                return None
        except FileNotFoundError:
            return None
        except (
            UnsafeFile,
            OSError,
            ValueError,
            TypeError,
            ProtocolError,
        ):  # a broken answer is asked again
            return None
        self.used += 1
        child = ChildResult(status="ok", value=entry.reply, returncode=0, seconds=entry.seconds)
        return child, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.asked))

    def store(self, key: str, child: ChildResult) -> None:
        """Keep a clean answer (see the module's docstring); anything else is not kept."""
        if not (
            child.ok and child.returncode == 0 and not child.timed_out and not child.stdout.strip()
        ):
            return
        folder = self._imports()
        if folder is None:
            return
        entry = ImportCheckCached(
            format=FORMAT,
            key=key,
            asked=time.time(),
            seconds=float(child.seconds),
            reply=dict(child.value),
        )
        try:
            write_file(folder / f"{key}.json", json.dumps(entry.to_json()), mode=0o600)
        except (UnsafeWrite, OSError) as exc:
            self.problem = f"the import-check cache is off: {exc}"
