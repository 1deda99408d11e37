"""The DP4A fold probes (engine/cuda/bench/microbench.py dp4a_fold_ceilings, cuda_src/microbench.cu): each launches its
kernel and counts 8 ops per DP4A over the chains and the DP4As of a round, so at equal time the 8-DP4A probe and the
4-DP4A one report equal TOPS (both run 4096 DP4As a chain)."""

from __future__ import annotations

import pytest

from engine.cuda.bench.microbench import DP4A_CHAINS, FOLD_DOTS, OPS_PER_DP4A, dp4a_fold_ceilings
from engine.cuda.kernel_build import CUDA_SRC_DIR
from tests.unit.test_sparse_bench import TimedFakeCard


def test_each_fold_probe_counts_its_dp4as_against_the_peak():
    card = TimedFakeCard()  # every timed graph: 1 ms for `reps` launches (time_graph_ms divides)
    folds = dp4a_fold_ceilings(card, peak_tops=100.0)
    assert [name for name, *_ in card.launches if name.startswith("dp4a")] == \
        [f"dp4a_fold_peak_d{d}" for d in FOLD_DOTS for _ in range(6)]  # the eager call and 5 captured
    ops = card.sm_count * 16 * 256 * 4096 * DP4A_CHAINS * OPS_PER_DP4A  # per launch, 1 ms / 5 reps each
    for dots in FOLD_DOTS:
        assert folds[str(dots)]["tops"] == pytest.approx(ops / (1e-3 / 5) / 1e12)
        assert folds[str(dots)]["fraction_of_dp4a_peak"] == pytest.approx(folds[str(dots)]["tops"] / 100.0)


def test_the_probes_exist_in_the_source():
    source = (CUDA_SRC_DIR / "microbench.cu").read_text()
    for dots in FOLD_DOTS:
        assert f"dp4a_fold_peak_d{dots}(" in source and f"dp4a_fold_body<{dots}>" in source
