"""Speculative decoding with the model's own MTP head (spec §6.10, issue 13) on the reference model.

One round, for a slot whose trunk has consumed everything up to x_n's position and is fed x_n:

1. draft: the MTP head turns (h_{n-1}, x_n) into q_1 and draws d_1 ~ q_1; for K=2 it chains
   (its own output, d_1) into q_2 and draws d_2. Chained rows land in the head's KV cache at the
   positions the true rows will take, so they are dropped again after the round.
2. verify: one trunk forward of [x_n, d_1, …, d_K] (K+1 rows) gives p_0 … p_K.
3. accept (engine.generation.speculative_rule): the accepted drafts and one more token, distributed
   exactly as token-by-token sampling from the target.
4. roll back on a rejection: the trunk returns to a `Checkpoint` taken before the verify (KV lengths,
   GDN state copies) and re-runs x_n plus the accepted drafts in one forward. That re-run costs a
   forward of j+1 tokens; it is the reference's way, chosen because the GDN layers only expose their
   final state. (The CUDA design keeps per-row GDN states in the verify instead; see the report.)

Only the last emitted token is left unfed, exactly like plain decoding, so a round is a "step" that
returns several tokens. At temperature 0 the output equals plain greedy decoding wherever the top-2
logit margin exceeds the batched-vs-single-token rounding (~1e-5 relative in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.generation.sampler import Sampler
from engine.generation.speculative_rule import AcceptRule, dense_distribution, sample_dense, speculative_sampling
from engine.reference.speculative_state import Checkpoint, MtpTrail
from engine.reference.model import ReferenceModel
from engine.reference.state import SequenceState

DRAFT_TOKENS = (1, 2)  # K values the round supports; K=1 is the default (the anchor's measured default)
_RNG_STREAM = 0x5BEC  # the draft/accept uniforms come from their own stream of the request's seed


@dataclass
class SpeculationStats:
    """Counts over verify rounds: drafts proposed and accepted, tokens emitted (accepted + 1 per round)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0

    def add(self, drafted: int, accepted: int, emitted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted

    def summary(self) -> str:
        return (f"MTP acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted} drafts), "
                f"{self.tokens_per_verify:.2f} tokens per verify over {self.rounds} rounds")


def speculation_rng(seed: int | None) -> np.random.Generator:
    """The request's generator for drafts and accept/reject draws: reproducible with a seed, and a
    different stream from the Sampler's (sharing one would correlate a draft with the token before it)."""
    return np.random.default_rng(None if seed is None else np.random.SeedSequence([seed, _RNG_STREAM]))


class MtpSpeculator:
    """Drives one reference model's trunk and MTP head 0 for any number of sequences (each with its trail)."""

    def __init__(self, model: ReferenceModel, draft_tokens: int = 1, rule: AcceptRule = speculative_sampling):
        if not model.mtp:
            raise ValueError("the model has no MTP head")
        if draft_tokens not in DRAFT_TOKENS:
            raise ValueError(f"draft_tokens must be one of {DRAFT_TOKENS}, got {draft_tokens}")
        self.model = model
        self.head = model.mtp[0]
        self.k = draft_tokens
        self.rule = rule
        self.stats = SpeculationStats()

    def new_trail(self) -> MtpTrail:
        return MtpTrail(self.model.cfg.d_model)

    def feed(self, state: SequenceState, trail: MtpTrail, tokens: Sequence[int]) -> np.ndarray:
        """A plain forward (prefill chunk or one decode token) that keeps the head's cache in step;
        returns the last token's logits [V]."""
        hidden = self.model.forward_hidden(tokens, state)
        trail.settle(self.head, state, hidden, [int(t) for t in tokens])
        return self.model.logits(hidden[-1:])[0]

    def round(self, state: SequenceState, trail: MtpTrail, token: int, sampler: Sampler, history: list[int],
              rng: np.random.Generator) -> list[int] | None:
        """Feed `token` and return the tokens it yields (accepted drafts + one); every one but the last is
        consumed by `state` and appended to `history` (which must already end with `token`).

        None when no draft can be made or a logits row is not finite: the trunk is then as before the
        call (the head's owed rows may be settled) and the caller takes a plain step with `feed`, whose
        pick reports bad logits.
        """
        first = trail.draft_row(self.head, state, token)  # settles the owed rows: the head is now in step
        if first is None or not np.isfinite(first[0]).all():
            return None
        after_true_rows = Checkpoint.of(state)
        drafts, draft_probs = self._drafts(state, first, sampler, history, rng)
        if drafts is None:
            after_true_rows.restore_mtp(state)
            return None
        hidden = self.model.forward_hidden([token] + drafts, state)
        logits = self.model.logits(hidden)
        after_true_rows.restore_mtp(state)  # the chained draft rows are not the head's true rows
        if not np.isfinite(logits).all():
            after_true_rows.restore_trunk(state)
            return None
        targets = [dense_distribution(sampler, logits[i], history + drafts[:i]) for i in range(self.k + 1)]
        emitted = self.rule(targets, drafts, draft_probs, rng)
        accepted = len(emitted) - 1
        if accepted < self.k:
            after_true_rows.restore_trunk(state)
            hidden = self.model.forward_hidden([token] + drafts[:accepted], state)
        trail.owe(hidden[: accepted + 1], drafts[:accepted])
        history += drafts[:accepted]
        self.stats.add(self.k, accepted, len(emitted))
        return emitted

    def _drafts(self, state: SequenceState, first: tuple[np.ndarray, np.ndarray], sampler: Sampler,
                history: list[int], rng: np.random.Generator) -> tuple[list[int], list[np.ndarray]] | tuple[None, None]:
        """K draft tokens and their distributions (each drawn from q with the request's own sampling rules)."""
        logits, out = first
        drafts: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(self.k):
            if i:
                rows, out = self.head.forward(out, [drafts[-1]], state)
                logits = rows[-1]
                if not np.isfinite(logits).all():
                    return None, None
            q = dense_distribution(sampler, logits, history + drafts)
            drafts.append(sample_dense(q, rng))
            probs.append(q)
        return drafts, probs
