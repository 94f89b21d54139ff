"""kernel_lock/registry.toml is parsed on first use, never at import: not by kernel_lock, not by the
modules of kernel-probe that read its tables (the built-in candidates, the known libraries)."""

from __future__ import annotations

import json
import subprocess
import sys

# Each child counts the times registry.toml is opened and parsed (kernel_lock.toml.loads
# given its text), through the imports named, then through a first use; a second use must not read
# it again.
_COUNT = """
import json, sys
from kernel_lock import toml
resources = __import__("importlib.resources").resources
text = resources.files("kernel_lock").joinpath("registry.toml").read_text()
reads = []
real = toml.loads
toml.loads = lambda s, *a, **k: (reads.append(s == text), real(s, *a, **k))[1]
{imports}
at_import = sum(reads)
{use}
first = sum(reads)
{use}
print(json.dumps([at_import, first, sum(reads)]))
"""


def _reads(imports: str, use: str) -> list[int]:
    code = _COUNT.format(imports=imports, use=use)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_kernel_lock_does_not_read_the_registry_and_first_use_does():
    reads = _reads(
        "import kernel_lock, kernel_lock.registry, kernel_lock.trust, kernel_lock.resolve",
        "kernel_lock.registry.allowed_roots()",
    )
    assert reads == [0, 1, 1]


def test_loading_a_lock_of_torch_classes_does_not_read_the_registry():
    reads = _reads(
        "import kernel_lock",
        "kernel_lock.trust.check_target('torch.nn.LayerNorm')",
    )
    assert reads == [0, 0, 0]  # torch's own classes are allowed without the registry


def test_kernel_probe_reads_the_registry_on_first_use_of_its_tables():
    reads = _reads(
        "import kernel_probe.candidates, kernel_probe.detect.libraries, kernel_probe.profiles",
        "kernel_probe.candidates.builtin(); kernel_probe.detect.libraries.known_libraries()",
    )
    assert reads[0] == 0, "registry.toml was parsed while importing"
    assert reads[1] >= 1 and reads[2] == reads[1], reads
