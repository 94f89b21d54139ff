"""The anemoi children's memory cap (``_address_space`` in kernel_probe/anemoi/children.py):
a child may map ``budget`` bytes beyond what it has mapped when the cap is set, after torch is
imported. Before, the cap was the whole address space (4 GiB), and a CUDA/ROCm build of torch, which
maps about 4.8 GB of libraries at import without touching them, could not even be imported under it
("failed to map segment from shared object"): check-config's schema check failed on every GPU site.
The cap keeps its purpose: an alias bomb or a runaway child ends as a MemoryError in the child."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from kernel_probe.anemoi import reading
from kernel_probe.isolation.child import run_function

BUDGET = 256 << 20

# A child that maps 8 GiB of address space without touching it (standing in for libtorch_cuda and
# its libraries), then asks for ``payload`` bytes within the budget: its answer, or MemoryError.
MAPPED_FIRST = textwrap.dedent(f"""\
    import mmap
    from kernel_probe.anemoi.children import _address_space, _mapped

    def allocate(payload):
        region = mmap.mmap(-1, 8 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                           | getattr(mmap, "MAP_NORESERVE", 0))
        before = _mapped()
        with _address_space({BUDGET}):
            block = bytearray(payload)
        region.close()
        return [before, len(block)]
""")


def allocate(size: int):
    return run_function("", "allocate", size, timeout=60, source=MAPPED_FIRST)


def test_a_child_that_has_mapped_gigabytes_still_gets_its_budget_on_top():
    result = allocate(BUDGET // 2)
    assert result.ok, result.reason
    before, size = result.value
    assert before > 8 << 30 and size == BUDGET // 2  # 8 GiB mapped, and half the budget on top


def test_the_budget_on_top_still_ends_in_a_memory_error():
    result = allocate(2 * BUDGET)
    assert not result.ok and result.raised.get("raised") == "MemoryError", result


@pytest.mark.slow  # the compose child imports Hydra, then expands until the cap: ~5 s
@pytest.mark.skipif(importlib.util.find_spec("hydra") is None, reason="hydra-core not installed")
def test_the_cap_still_stops_a_yaml_alias_bomb_in_the_compose_child(tmp_path, monkeypatch):
    """Hydra expands the aliases (10**6 strings, an OmegaConf node each: GBs) in the child, which
    ends within its budget (a MemoryError, or a SIGSEGV where libyaml's C code meets the failed
    allocation); the caller stays up and says so."""
    levels = ["a: &a [" + ", ".join(['"x"'] * 10) + "]"]
    for prev, name in zip("abcde", "bcdef", strict=True):
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    (tmp_path / "bomb.yaml").write_text("\n".join(levels) + "\nmodel: {junk: *f}\n")
    monkeypatch.setattr(reading, "COMPOSE_MEMORY", 64 << 20)
    reply, why, kind = reading.compose(tmp_path, "bomb", [], timeout=120)
    assert reply is None and kind in ("MemoryError", "crashed"), (why, kind)
