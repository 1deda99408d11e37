"""Cut generated text at the first stop string, holding back only a tail that could still become one."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text deltas; get back the text that is safe to show and whether a stop string was hit."""

    def __init__(self, stops: Sequence[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        buf = self._held + text
        cuts = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if cuts:
            self.hit, self._held = True, ""
            return buf[: min(cuts)]
        keep = max((n for s in self._stops for n in range(1, len(s)) if buf.endswith(s[:n])), default=0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back tail once generation is over (it never became a stop string)."""
        held, self._held = self._held, ""
        return "" if self.hit else held
