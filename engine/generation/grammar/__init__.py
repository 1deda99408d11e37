"""Constrained decoding on llguidance: grammars for JSON and tool calls, and one token bitset per step."""
