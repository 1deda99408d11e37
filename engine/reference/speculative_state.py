"""Rolling a reference sequence back after a rejected draft, and the MTP head's owed input rows.

Rollback: `SequenceState.snapshot()` copies every KV cache, O(context) per verify. A verify only
appends rows, so a `Checkpoint` keeps just the cache lengths (rows past them are overwritten by the
next append) and copies of the GDN states (a recurrent summary that cannot be cut back). Restoring
it is exact: the state is the one the checkpoint was taken from, bit for bit.

`MtpTrail`: the MTP head's row t pairs the trunk's hidden h_t with token x_{t+1}, so a row can only
be computed once the token after it is known, and after a verify the accepted rows are owed until
the next draft. The trail keeps those hidden rows (and the tokens that followed all but the last)
so that one batched head call settles them together with the next draft row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.reference.mtp import MtpHead
from engine.reference.state import SequenceState


@dataclass(frozen=True)
class Checkpoint:
    """Cache lengths, positions and GDN state copies of a `SequenceState` (trunk and/or MTP blocks)."""

    n_tokens: int
    next_position: int
    kv_lengths: dict[int, int]
    gdn: dict[int, tuple[np.ndarray, np.ndarray]]
    mtp: tuple[tuple[int, int], ...]  # (KV length, next position) per MTP block

    @classmethod
    def of(cls, state: SequenceState) -> Checkpoint:
        return cls(state.n_tokens, state.next_position, {i: c.length for i, c in state.kv.items()},
                   {i: (s.conv.copy(), s.recurrent.copy()) for i, s in state.gdn.items()},
                   tuple((m.kv.length, m.next_position) for m in state.mtp))

    def restore_trunk(self, state: SequenceState) -> None:
        """Back to the checkpoint's trunk: later KV rows dropped, GDN states as they were."""
        state.n_tokens, state.next_position = self.n_tokens, self.next_position
        for i, length in self.kv_lengths.items():
            state.kv[i].truncate(length)
        for i, (conv, recurrent) in self.gdn.items():
            state.gdn[i].conv, state.gdn[i].recurrent = conv.copy(), recurrent.copy()

    def restore_mtp(self, state: SequenceState) -> None:
        """Back to the checkpoint's MTP caches (drops chained draft rows)."""
        for block, (length, position) in zip(state.mtp, self.mtp):
            block.kv.truncate(length)
            block.next_position = position


class MtpTrail:
    """Trunk hidden rows whose MTP rows are owed: `hidden` [r, D] and the r−1 tokens after all but the last.

    The token after the last row is the next token the trunk is fed; until then that row cannot run.
    """

    def __init__(self, d_model: int):
        self.hidden = np.zeros((0, d_model), np.float32)
        self.tokens: list[int] = []

    def settle(self, head: MtpHead, state: SequenceState, hidden: np.ndarray, tokens: list[int]) -> None:
        """The trunk consumed `tokens` (hidden rows `hidden`): run every MTP row that is now complete,
        in one head call, and owe the last hidden row."""
        rows = np.concatenate([self.hidden, hidden[:-1]])
        following = self.tokens + tokens if len(self.hidden) else tokens[1:]
        if len(rows):
            head.forward(rows, following, state)
        self.hidden, self.tokens = hidden[-1:].copy(), []

    def draft_row(self, head: MtpHead, state: SequenceState, token: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Settle the owed rows with `token` (the next token fed) and return the last row's (logits [V], out [1, D]),
        which drafts the token after `token`; None when there is no hidden row yet (nothing was fed)."""
        if not len(self.hidden):
            return None
        logits, out = head.forward(self.hidden, self.tokens + [token], state)
        self.hidden, self.tokens = self.hidden[:0], []
        return logits[-1], out[-1:]

    def owe(self, hidden: np.ndarray, tokens: list[int]) -> None:
        """After a verify: the trunk's rows `hidden` [j+1, D] and the j accepted drafts that followed them."""
        self.hidden, self.tokens = hidden.copy(), list(tokens)

    def frozen(self) -> tuple[np.ndarray, np.ndarray]:
        """Read-only copies (hidden, tokens as int64) for a slot snapshot."""
        hidden, tokens = self.hidden.copy(), np.asarray(self.tokens, np.int64)
        hidden.setflags(write=False)
        tokens.setflags(write=False)
        return hidden, tokens

    @classmethod
    def thawed(cls, frozen: tuple[np.ndarray, np.ndarray]) -> MtpTrail:
        hidden, tokens = frozen
        trail = cls(hidden.shape[1])
        trail.hidden, trail.tokens = np.array(hidden, np.float32), [int(t) for t in tokens]
        return trail
