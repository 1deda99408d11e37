"""Sparse prefill attention (issue 10): per-head patterns, their calibration and saved profiles."""
