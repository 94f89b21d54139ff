"""kernel_probe.probe.stale: the one comparison of what a lock was probed for, which `--check`
(pipeline.reusable) and `kernel-probe diff` (derive.lock_differences) both make (issue 56)."""

from __future__ import annotations

import pytest

from kernel_probe.probe import derive, pipeline, stale
from tests.conftest import MINIMAL_LOCK, sealed_lock, write_sealed

HEAD = 'created-by = "hand"\n'
PROBED = f'{HEAD}provenance = {{ inputs = "sha256:{"1" * 64}" }}\n'


def test_check_and_diff_make_the_same_comparison(tmp_path, monkeypatch):
    """Both callers take their differences from stale.differences: change it, and both change."""
    seen = []

    def differences(old, new, judged=()):
        seen.append((old, new))
        return [stale.Difference("options", {"shapes": "a"}, {"shapes": "b"}, "the one answer")]

    monkeypatch.setattr(stale, "differences", differences)
    path = write_sealed(tmp_path / "k.toml", MINIMAL_LOCK.replace(HEAD, PROBED, 1))
    lock, why = pipeline.reusable(path, "sha256:" + "1" * 64)
    assert lock is None and why == "the one answer"
    found = derive.lock_differences(sealed_lock(), sealed_lock())
    assert found["probe"] == [
        {"what": "options", "a": {"shapes": "a"}, "b": {"shapes": "b"}, "why": "the one answer"}
    ]
    assert len(seen) == 2 and seen[1][0] == seen[1][1]  # a lock against itself: the same record


@pytest.mark.parametrize(
    "old,new,what",
    [
        (stale.Probed("d"), stale.Probed("d"), []),
        (stale.Probed("d", {"shapes": "1x2"}), stale.Probed("e", {"shapes": "3x4"}), ["options"]),
        # not known on one side: the libraries are not compared
        (stale.Probed("d", libraries={"apex": ""}), stale.Probed("d"), []),
        (
            stale.Probed("d", libraries={"apex": ""}),
            stale.Probed("d", libraries={"apex": "installed"}),
            ["libraries"],
        ),
        (stale.Probed("d", profile={"name": "p"}), stale.Probed("d"), ["profile"]),
    ],
)
def test_what_is_compared(old, new, what):
    assert [d.what for d in stale.differences(old, new)] == what


def test_the_lock_records_what_the_plan_compares():
    """A lock's record of its probe is read back as the plan's own (of_lock)."""
    text = MINIMAL_LOCK.replace(
        HEAD,
        f'{HEAD}provenance = {{ inputs = "sha256:{"2" * 64}", options = {{ shapes = "64x32" }}, '
        'libraries = { liger-kernel = "0.8.5" } }\n',
        1,
    )
    probed = stale.Probed.of_lock(sealed_lock(text))
    assert probed == stale.Probed(
        "sha256:" + "2" * 64, {"shapes": "64x32"}, {"liger-kernel": "0.8.5"}, {}, None
    )
