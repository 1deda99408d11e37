"""Per-card alert thresholds with debounce: an alert fires after `samples` readings in a row over the
limit and clears after as many under it, so one noisy reading neither raises nor clears it."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.telemetry import CardSample


@dataclass(frozen=True)
class AlertRule:
    metric: str  # a CardSample attribute
    limit: float
    label: str
    samples: int = 3


DEFAULT_RULES = (
    AlertRule("temperature_c", 85, "core temperature"),
    AlertRule("hbm_temperature_c", 90, "HBM temperature"),
    AlertRule("power_w", 240, "power"),
)


@dataclass
class AlertState:
    rules: tuple[AlertRule, ...] = DEFAULT_RULES
    _streak: dict[tuple[int, str], int] = field(default_factory=dict)
    active: dict[tuple[int, str], str] = field(default_factory=dict)  # (card, metric) -> message

    def feed(self, cards: tuple[CardSample, ...]) -> list[str]:
        """Update with one snapshot; returns messages of alerts that fired on this reading."""
        fired = []
        for card in cards:
            for rule in self.rules:
                value = getattr(card, rule.metric)
                if value is None:
                    continue
                key = (card.index, rule.metric)
                over = value > rule.limit
                active = key in self.active
                streak = self._streak.get(key, 0) + 1 if over != active else 0
                self._streak[key] = streak
                if streak >= rule.samples:
                    self._streak[key] = 0
                    if over:
                        message = f"card {card.index}: {rule.label} {value:g} over {rule.limit:g}"
                        self.active[key] = message
                        fired.append(message)
                    else:
                        del self.active[key]
        return fired

    def for_card(self, index: int) -> list[str]:
        return [m for (card, _), m in self.active.items() if card == index]
