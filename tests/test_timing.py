"""kernel_probe.probe.timing's pure parts on CPU: statistics, shapes, progress messages (not timings)."""

from __future__ import annotations


# ---- progress while timing (issue 16, point 5) -------------------------------------------------------------
def test_timing_progress_estimates_what_is_left():
    from kernel_probe.commands.probe import TimingProgress
    from kernel_probe.probe.timing import progress_message

    shown: list[str] = []
    p = TimingProgress("timing LayerNorm: torch.layer_norm", ["1000x100", "4000x100"], shown.append, every=3600)
    p(progress_message("1000x100", 0, 2, "first call", 1, 1, 0.5))
    p(progress_message("1000x100", 0, 2, "rep", 1, 5, 1.0))  # rate-limited: same shape, not the last
    p(progress_message("1000x100", 0, 2, "rep", 5, 5, 3.0))
    assert len(shown) == 2
    assert "first call 1/1" in shown[0]
    # 3 s over 6 calls: 0.5 s per call; the next shape is 4x the elements: 4 x 6 calls x 0.5 s = 12 s
    assert "rep 5/5, 0.5 s per call, about 12 s for the shapes after it" in shown[1]
    mid = p.text(progress_message("4000x100", 1, 2, "rep", 2, 5, 6.0))
    assert "rep 2/5, 2 s per call, about 6 s left at this shape" in mid
