"""Cut generated text at the first stop string, holding back only a tail that could still become one.

Matching is linear in the text: each stop string runs a Knuth-Morris-Pratt automaton whose state is
the longest prefix of it that the text so far ends with, so a generated character costs amortised
O(1) per stop string however long the strings are (the request limits bound their count and length;
engine.generation.serving.request_limits). The held tail is the longest such prefix over all stop strings.
"""

from __future__ import annotations

from collections.abc import Sequence


def _failure(pattern: str) -> list[int]:
    """KMP's table: for each prefix length k, the longest proper border of pattern[:k]."""
    table = [0] * (len(pattern) + 1)
    border = 0
    for i in range(1, len(pattern)):
        while border and pattern[i] != pattern[border]:
            border = table[border]
        if pattern[i] == pattern[border]:
            border += 1
        table[i + 1] = border
    return table


class _Automaton:
    """One stop string's matcher: `state` is how many of its first characters the text ends with."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._table = _failure(pattern)
        self.state = 0

    def step(self, char: str) -> bool:
        """Advance by one character; True when the whole pattern has just been matched."""
        pattern, state = self.pattern, self.state
        while state and (state == len(pattern) or pattern[state] != char):
            state = self._table[state]
        if pattern[state] == char:
            state += 1
        self.state = state
        return state == len(pattern)


class StopMatcher:
    """Feed text deltas; get back the text that is safe to show and whether a stop string was hit."""

    def __init__(self, stops: Sequence[str]):
        self._automata = [_Automaton(s) for s in stops if s]
        self._held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        if not self._automata:
            return text
        buf = self._held + text
        start = len(self._held)
        for i in range(start, len(buf)):
            char = buf[i]
            ended = [a for a in self._automata if a.step(char)]
            if ended:  # the longest string ending here starts earliest
                self.hit, self._held = True, ""
                return buf[: i + 1 - max(len(a.pattern) for a in ended)]
        keep = max(a.state for a in self._automata)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back tail once generation is over (it never became a stop string)."""
        held, self._held = self._held, ""
        return "" if self.hit else held
