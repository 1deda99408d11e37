"""What `rigllm doctor` reports: one `Check` per area, each problem with a one-line fix.

A probe that fails unexpectedly must not end the report (support asks for the whole output), so
`guarded` turns any exception from a probe into a check that says which probe broke and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

ERROR = "error"  # rigllm cannot use the GPU path (or the named file) until it is fixed
WARNING = "warning"  # works, but slower or more fragile than it should be


@dataclass(frozen=True)
class Problem:
    severity: str
    what: str
    fix: str


@dataclass
class Check:
    """One area: a summary line, detail lines, machine-readable data and the problems found."""

    name: str
    summary: str
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def problem(self, severity: str, what: str, fix: str) -> None:
        self.problems.append(Problem(severity, what, fix))


def guarded(name: str, probe: Callable[[], Check]) -> Check:
    """Run a probe; an unexpected exception becomes a check with one error instead of a traceback."""
    try:
        return probe()
    except Exception as err:  # the diagnostic must survive whatever a broken driver or file does
        check = Check(name, f"probe failed: {type(err).__name__}: {err}")
        check.problem(ERROR, f"the {name} probe failed ({type(err).__name__}: {err})",
                      "report this output (rigllm doctor --json) with the issue")
        return check


def to_json(checks: list[Check]) -> dict[str, Any]:
    problems = [{"check": c.name, **asdict(p)} for c in checks for p in c.problems]
    return {
        "ok": not any(p["severity"] == ERROR for p in problems),
        "checks": [asdict(c) for c in checks],
        "problems": problems,
    }


def render_text(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks) + 2
    lines = []
    for c in checks:
        lines.append(f"{c.name:<{width}}{c.summary}")
        lines += [f"{'':<{width}}{d}" for d in c.details]
    problems = [p for c in checks for p in c.problems]
    if problems:
        lines.append("")
        lines.append(f"problems ({len(problems)}):")
        for p in problems:
            lines.append(f"  {p.severity}: {p.what}")
            lines.append(f"    fix: {p.fix}")
    else:
        lines.append("")
        lines.append("no problems found")
    return "\n".join(lines)
