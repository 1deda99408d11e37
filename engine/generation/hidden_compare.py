"""Where two runs of a model part ways: the relative difference of the hidden rows per (layer, sub-step).

`rigllm debug compare` records two `HiddenTrace`s of the same tokens (the reference in kernel-rounding mode
and another backend or mode) and reports, for every place in forward order, the relative difference of
each token's row, max |a - b| / max |b| over the row's D values, as its worst and median over the tokens,
and names the first place whose worst token is over a threshold. A bug inside one layer shows as a jump
at that layer's sub-step while the places before it stay at the rounding floor. A layer-local comparison whose
replay attended over the other run's own K/V rows also reports, per attention layer, the share of those stored
values that differ from the replay's own encoding of them, and the layers over a bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from engine.reference.hidden_trace import HiddenTrace


@dataclass(frozen=True)
class PlaceDiff:
    layer: int
    step: str
    worst: float  # largest per-token relative difference
    worst_token: int  # its token index in feed order
    median: float


@dataclass(frozen=True)
class CompareReport:
    places: list[PlaceDiff]
    logits_worst: float  # relative difference of the logits after each feed, worst feed
    logits_agree: int  # feeds whose arg-max agrees
    feeds: int
    threshold: float
    stored_kv: dict[int, float] = field(default_factory=dict)  # attention layer -> share of stored values differing
    stored_kv_bound: float = 0.0

    @property
    def first_over(self) -> PlaceDiff | None:
        return next((p for p in self.places if not p.worst <= self.threshold), None)

    @property
    def stored_kv_over(self) -> list[int]:
        return [layer for layer, share in sorted(self.stored_kv.items()) if not share <= self.stored_kv_bound]

    def as_dict(self) -> dict:
        first = self.first_over
        out = {"threshold": self.threshold, "places": [asdict(p) for p in self.places],
               "logits": {"worst": self.logits_worst, "top1_agree": self.logits_agree, "feeds": self.feeds},
               "first_over": None if first is None else asdict(first)}
        if self.stored_kv:
            out["stored_kv"] = {"bound": self.stored_kv_bound, "over": self.stored_kv_over,
                                "differing": {str(layer): share for layer, share in sorted(self.stored_kv.items())}}
        return out

    def render(self) -> str:
        lines = [f"{'layer':>5} {'step':<6} {'worst rel':>10} {'at token':>8} {'median':>10}"]
        first = self.first_over
        for p in self.places:
            mark = "  <- first over the threshold" if p is first else ""
            lines.append(f"{p.layer:>5} {p.step:<6} {p.worst:>10.3e} {p.worst_token:>8} {p.median:>10.3e}{mark}")
        lines.append(f"logits: worst rel {self.logits_worst:.3e}, top-1 agree {self.logits_agree}/{self.feeds}")
        lines.append(f"first place over {self.threshold:g}: "
                     + ("none" if first is None else f"layer {first.layer} {first.step} ({first.worst:.3e} at token "
                                                     f"{first.worst_token})"))
        if self.stored_kv:
            shares = ", ".join(f"layer {layer} {share:.2e}" for layer, share in sorted(self.stored_kv.items()))
            over = ", ".join(map(str, self.stored_kv_over)) or "none"
            lines.append(f"stored K/V values differing from the replay's encoding: {shares}; layers over "
                         f"{self.stored_kv_bound:g}: {over}")
        return "\n".join(lines)


def row_differences(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per-row max |got - want| / max |want| ([T]); a non-finite value counts as infinitely different."""
    if got.shape != want.shape:
        raise ValueError(f"hidden rows of different shapes: {got.shape} vs {want.shape}")
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(got64 - want64).max(axis=-1) / np.maximum(np.abs(want64).max(axis=-1), 1e-30)
    return np.where(np.isfinite(rel), rel, np.inf)


def compare_traces(base: HiddenTrace, other: HiddenTrace, base_logits: list[np.ndarray],
                   other_logits: list[np.ndarray], threshold: float) -> CompareReport:
    """The report of `other` against `base` (both traced over the same feeds)."""
    if base.places() != other.places():
        raise ValueError(f"the runs recorded different places: {base.places()} vs {other.places()}")
    places = []
    for layer, step in base.places():
        rel = row_differences(other.rows(layer, step), base.rows(layer, step))
        worst = int(np.argmax(rel))
        places.append(PlaceDiff(layer, step, float(rel[worst]), worst, float(np.median(rel))))
    got, want = np.stack(other_logits), np.stack(base_logits)
    logits_rel = row_differences(got, want)
    agree = int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
    return CompareReport(places, float(logits_rel.max()), agree, len(base_logits), threshold)
