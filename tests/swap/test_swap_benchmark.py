"""Noise in swap timings is judged on the paired ratios of interleaved rounds: a speedup every round agrees
on is not noise, however far the machine's load moved both sides between rounds."""

from __future__ import annotations

from opscope.kernels.bench import summarize
from opscope.swap import benchmark


def timing(ms: list[float]):  # noqa: ANN201
    return summarize([m / 1e3 for m in ms])


def test_a_speedup_every_round_agrees_on_is_not_noise():
    # Load drifts between rounds (49 to 95.6 ms for the original), so the two sides' p20-p80 ranges overlap
    # (53.8-91.1 ms and 33.2-56.4 ms), but every round's swapped step is at least 1.6x faster.
    original = timing([49.0, 95.6, 55.0, 90.0, 72.3])
    swapped = timing([30.0, 58.0, 34.0, 56.0, 40.5])
    assert original.p20_ms <= swapped.p80_ms  # the ranges overlap
    assert not benchmark.within_noise(original, swapped)
    assert benchmark.EndToEnd(original, swapped, repeats=5).to_json()["within_noise"] is False


def test_rounds_that_disagree_are_noise():
    original = timing([10.0, 10.0, 10.0, 10.0, 10.0])
    swapped = timing([9.0, 11.0, 10.0, 10.5, 9.5])  # ratios 1.11, 0.91, 1.0, 0.95, 1.05
    assert benchmark.within_noise(original, swapped)
