"""Outpost's benchmarks: ``python -m bench`` (full run) or ``python -m bench --smoke``.

Every figure is measured against a baseline taken in the same run, in interleaved rounds
(baseline, subject, baseline, subject, ...), so that the drift of a noisy machine hits both; a
figure's ratio is the median of its per-round ratios. See ``bench/README.md``.
"""

from __future__ import annotations
