"""JSON mode: a byte-level JSON pushdown automaton and the per-step masks of tokens that keep it valid.

`response_format: {"type": "json_object"}` promises one JSON object. The automaton reads the bytes
the tokens stand for (the text a client gets) and rejects any byte that cannot continue a JSON text
whose top level is an object; a token is allowed when all of its bytes are accepted. Strings accept
exactly the well-formed UTF-8 sequences (no overlong forms, no encoded surrogates), so the reply
decodes without replacement characters even when a character is split across tokens.

Two rules keep a random or stubborn model from running forever or past its budget:
* whitespace between tokens of the grammar is limited to runs of `MAX_WHITESPACE` bytes;
* every state knows the fewest bytes that complete the object (`closing_cost`; each of those bytes is
  a single-byte token in a byte-level vocabulary). A token is allowed only if, after it, the object
  can still be completed within the tokens left, so with enough `max_tokens` for the cheapest
  completion the output is always complete.

Masks are cached by automaton state. A token can only look as deep into the stack as it has closing
brackets, so the cache key holds the top `max_closers` frames (the whole stack when it is shallower).
Computing a mask walks a byte trie of the vocabulary (kept as a sorted list of byte strings: a subtree
is a range found by bisection), pruning each rejected prefix. Inside a string, where nearly every
token is allowed, tokens without `"`, `\\` or control bytes are checked at once with numpy from
their precomputed UTF-8 shape and only the others are run through the automaton; the same fast path
takes over the walk when a token's first byte enters a string (`"`, or the end of an escape).
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.generation.tokenizer import Tokenizer

MAX_WHITESPACE = 24  # llama.cpp's JSON grammar allows a newline plus up to 20 indentation bytes
CACHE_BYTES = 64 << 20  # masks kept per vocabulary (each is 2 bytes per token)
_REJECTED = np.iinfo(np.int16).max

# Automaton modes. Structural modes carry the length of the current whitespace run as `aux`.
START, OBJ_FIRST, OBJ_KEY, COLON, VALUE, ARR_FIRST, AFTER, STR_KEY, STR_VAL, NUM, LIT, DONE = range(12)
# String `aux`: 0 plain; 1 after a backslash; 2-5 inside \\u with 6 - aux hex digits to go; 6-12 inside
# a UTF-8 character (`_CONTINUATION`: the next byte's range, the code after it, bytes to go).
_ESC, _HEX4, _HEX1 = 1, 2, 5
_CONTINUATION = {
    6: (0x80, 0xBF, 0, 1), 7: (0x80, 0xBF, 6, 2), 8: (0x80, 0xBF, 7, 3),  # any continuation byte next
    9: (0xA0, 0xBF, 6, 2), 10: (0x80, 0x9F, 6, 2), 11: (0x90, 0xBF, 7, 3), 12: (0x80, 0x8F, 7, 3),  # after E0, ED, F0, F4
}
_ANY_CONTINUATION = (0, 6, 7, 8)  # string codes where the fast path applies (no range restriction)
# Number `aux`: after '-', after a leading 0, integer digits, after '.', fraction digits, after 'e',
# after the exponent sign, exponent digits.
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_INT = range(8)
_NUMBER_ENDS = frozenset((N_ZERO, N_INT, N_FRAC, N_EXP_INT))

State = tuple[str, int, "int | bytes"]  # (open containers, e.g. "{[", mode, aux); LIT's aux: bytes to go
START_STATE: State = ("", START, 0)

_WS = frozenset(b" \t\n\r")
_ESCAPES = frozenset(b'"\\/bfnrt')
_HEX = frozenset(b"0123456789abcdefABCDEF")
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
_Q, _BS, _LB, _RB, _LS, _RS = b'"\\{}[]'
_COMMA, _COLON, _MINUS, _PLUS, _DOT, _ZERO = b",:-+.0"


def _lead_code(b: int) -> int | None:
    """The string code after a UTF-8 lead byte (None: not a lead byte of well-formed UTF-8)."""
    if 0xC2 <= b <= 0xDF:
        return 6
    if 0xE0 <= b <= 0xEF:
        return 9 if b == 0xE0 else 10 if b == 0xED else 7
    if 0xF0 <= b <= 0xF4:
        return 11 if b == 0xF0 else 12 if b == 0xF4 else 8
    return None


def step(state: State, byte: int) -> State | None:
    """The state after one more byte, or None when no JSON object text can continue that way."""
    stack, mode, aux = state
    if mode == STR_KEY or mode == STR_VAL:
        return _string(stack, mode, aux, byte)  # type: ignore[arg-type]
    if mode == NUM:
        return _number(stack, aux, byte)  # type: ignore[arg-type]
    if mode == LIT:
        rest: bytes = aux  # type: ignore[assignment]
        if byte != rest[0]:
            return None
        return (stack, AFTER, 0) if len(rest) == 1 else (stack, LIT, rest[1:])
    if mode == DONE:
        return None
    return _structural(stack, mode, aux, byte)  # type: ignore[arg-type]


def _structural(stack: str, mode: int, ws: int, b: int) -> State | None:
    if b in _WS:
        return (stack, mode, ws + 1) if ws < MAX_WHITESPACE else None
    if mode == START:
        return ("{", OBJ_FIRST, 0) if b == _LB else None
    if mode == OBJ_FIRST or mode == OBJ_KEY:
        if b == _Q:
            return (stack, STR_KEY, 0)
        return _close(stack) if b == _RB and mode == OBJ_FIRST else None
    if mode == COLON:
        return (stack, VALUE, 0) if b == _COLON else None
    if mode == AFTER:
        top = stack[-1]
        if b == _COMMA:
            return (stack, OBJ_KEY if top == "{" else VALUE, 0)
        if (b == _RB and top == "{") or (b == _RS and top == "["):
            return _close(stack)
        return None
    if b == _RS and mode == ARR_FIRST:
        return _close(stack)
    return _value_start(stack, b)  # VALUE or ARR_FIRST


def _close(stack: str) -> State:
    rest = stack[:-1]
    return (rest, AFTER, 0) if rest else ("", DONE, 0)


def _value_start(stack: str, b: int) -> State | None:
    if b == _Q:
        return (stack, STR_VAL, 0)
    if b == _LB:
        return (stack + "{", OBJ_FIRST, 0)
    if b == _LS:
        return (stack + "[", ARR_FIRST, 0)
    if b == _MINUS:
        return (stack, NUM, N_MINUS)
    if b == _ZERO:
        return (stack, NUM, N_ZERO)
    if 0x31 <= b <= 0x39:
        return (stack, NUM, N_INT)
    rest = _LITERALS.get(b)
    return (stack, LIT, rest) if rest else None


def _string(stack: str, mode: int, aux: int, b: int) -> State | None:
    if aux == 0:
        if b == _Q:
            return (stack, COLON if mode == STR_KEY else AFTER, 0)
        if b == _BS:
            return (stack, mode, _ESC)
        if b < 0x20:
            return None
        if b < 0x80:
            return (stack, mode, 0)
        code = _lead_code(b)
        return None if code is None else (stack, mode, code)
    if aux == _ESC:
        if b in _ESCAPES:
            return (stack, mode, 0)
        return (stack, mode, _HEX4) if b == ord("u") else None
    if aux <= _HEX1:
        return (stack, mode, 0 if aux == _HEX1 else aux + 1) if b in _HEX else None
    low, high, after, _ = _CONTINUATION[aux]
    return (stack, mode, after) if low <= b <= high else None


def _number(stack: str, sub: int, b: int) -> State | None:
    digit = 0x30 <= b <= 0x39
    if sub == N_MINUS:
        return (stack, NUM, N_ZERO if b == _ZERO else N_INT) if digit else None
    if sub == N_ZERO or sub == N_INT:
        if digit and sub == N_INT:
            return (stack, NUM, N_INT)
        if b == _DOT:
            return (stack, NUM, N_DOT)
        if b in b"eE":
            return (stack, NUM, N_EXP)
    elif sub == N_DOT:
        return (stack, NUM, N_FRAC) if digit else None
    elif sub == N_FRAC:
        if digit:
            return (stack, NUM, N_FRAC)
        if b in b"eE":
            return (stack, NUM, N_EXP)
    elif sub == N_EXP:
        if b == _PLUS or b == _MINUS:
            return (stack, NUM, N_EXP_SIGN)
        return (stack, NUM, N_EXP_INT) if digit else None
    elif sub == N_EXP_SIGN:
        return (stack, NUM, N_EXP_INT) if digit else None
    elif digit:  # N_EXP_INT
        return (stack, NUM, N_EXP_INT)
    return _structural(stack, AFTER, 0, b) if sub in _NUMBER_ENDS else None


def run(state: State, data: bytes) -> State | None:
    """The state after all of `data`, or None if some byte is rejected."""
    for b in data:
        next_state = step(state, b)
        if next_state is None:
            return None
        state = next_state
    return state


def accepts(text: str | bytes) -> bool:
    """Is `text` exactly one JSON object (surrounding whitespace runs within the limit)?"""
    data = text.encode("utf-8") if isinstance(text, str) else text
    end = run(START_STATE, data.rstrip(b" \t\n\r"))
    return end is not None and end[1] == DONE


def _pending_cost(aux: int) -> int:
    """Bytes that finish an escape or a UTF-8 character in progress."""
    if aux == 0:
        return 0
    if aux == _ESC:
        return 1
    if aux <= _HEX1:
        return 6 - aux
    return _CONTINUATION[aux][3]


_CODE_COST = np.array([_pending_cost(code) for code in range(13)], dtype=np.int16)  # by string code
_MODE_COST = {START: 2, OBJ_FIRST: 0, ARR_FIRST: 0, AFTER: 0, OBJ_KEY: 4, COLON: 2, VALUE: 1, DONE: 0}


def closing_cost(state: State) -> int:
    """Fewest bytes that complete the object from `state` (each step of that path lowers it by one).

    A pending value costs `0`, a pending key `"":0`, each open container its closing bracket.
    """
    stack, mode, aux = state
    if mode == STR_KEY:
        local = 3 + _pending_cost(aux)  # type: ignore[arg-type]
    elif mode == STR_VAL:
        local = 1 + _pending_cost(aux)  # type: ignore[arg-type]
    elif mode == NUM:
        local = 0 if aux in _NUMBER_ENDS else 1
    elif mode == LIT:
        local = len(aux)  # type: ignore[arg-type]
    else:
        local = _MODE_COST[mode]
    return local + len(stack)


def _utf8_shape(data: bytes) -> tuple[int, bool, int]:
    """(leading continuation bytes, is the rest well-formed UTF-8 up to a cut at the end, the string
    code after it: 0, or the code of the character the token ends inside)."""
    if data.isascii():
        return 0, True, 0
    lead = 0
    while lead < len(data) and 0x80 <= data[lead] <= 0xBF:
        lead += 1
    code = 0
    for b in data[lead:]:
        if code:
            low, high, code, _ = _CONTINUATION[code]
            if not low <= b <= high:
                return lead, False, 0
        elif b >= 0x80:
            lead_code = _lead_code(b)
            if lead_code is None:
                return lead, False, 0
            code = lead_code
    return lead, True, code


class _StringShapes:
    """Per sorted key, the UTF-8 shape of its bytes from `offset` on, for the inside-a-string fast path.

    Keys whose suffix has a quote or backslash (`special`, sorted key indices) can leave the string
    and are run through the automaton; a suffix with a control byte is never valid inside a string.
    """

    def __init__(self, keys: Sequence[bytes], offset: int):
        n = len(keys)
        self.plain = np.zeros(n, dtype=bool)
        self.lead = np.zeros(n, dtype=np.int8)
        self.well_formed = np.zeros(n, dtype=bool)
        self.tail = np.zeros(n, dtype=np.int8)
        self.length = np.zeros(n, dtype=np.int32)
        special = []
        for k, key in enumerate(keys):
            data = key[offset:]
            if b'"' in data or b"\\" in data:
                special.append(k)
            elif not data or min(data) >= 0x20:
                lead, ok, tail = _utf8_shape(data)
                self.plain[k], self.lead[k], self.well_formed[k], self.tail[k] = True, min(lead, 4), ok, tail
                self.length[k] = len(data)
        self.special = np.array(special, dtype=np.int64)


class JsonVocab:
    """A vocabulary prepared for JSON masks: token bytes as a sorted trie, string shapes, a mask cache.

    Built once per tokenizer (`json_vocab`); shared by all requests, thread-safe.
    """

    def __init__(self, token_bytes: Sequence[bytes], banned: Collection[int]):
        """`banned`: ids never allowed (end-of-generation and control tokens: they are not JSON text)."""
        self.size = len(token_bytes)
        self.token_bytes = list(token_bytes)
        groups: dict[bytes, list[int]] = {}
        for tid, data in enumerate(self.token_bytes):
            if data and tid not in banned:
                groups.setdefault(data, []).append(tid)
        self._keys = sorted(groups)  # unique byte strings; a prefix's tokens form a contiguous range
        index = {key: k for k, key in enumerate(self._keys)}
        self._ids = np.array([tid for key in self._keys for tid in groups[key]], dtype=np.int64)
        self._id_keys = np.array([index[key] for key in self._keys for _ in groups[key]], dtype=np.int64)
        self.max_closers = max((k.count(b"}") + k.count(b"]") for k in self._keys), default=0)
        self._shapes = (_StringShapes(self._keys, 0), _StringShapes(self._keys, 1))
        self._cache: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._cache_entries = max(8, CACHE_BYTES // max(1, 2 * self.size))
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> JsonVocab:
        banned = set(tokenizer.special_ids) | set(tokenizer.eos_ids)
        return cls([tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)], banned)

    # ---- masks -----------------------------------------------------------------------------------
    def mask(self, state: State, remaining: int) -> np.ndarray:
        """Tokens allowed in `state` when `remaining` tokens (this one included) may still be generated:
        each keeps the text valid and leaves the object completable in the tokens after it. When the
        budget is already too small for that, the tokens that merely keep the text valid."""
        costs = self.costs(state)
        limit = min(remaining - 1 - len(state[0]), int(_REJECTED) - 1)
        allowed = costs <= limit
        return allowed if allowed.any() else costs < _REJECTED

    def costs(self, state: State) -> np.ndarray:
        """int16 per token: `closing_cost` after the token minus the current stack depth (rejected:
        int16 max). Cached by the part of the state a token can see."""
        stack, mode, aux = state
        deep = len(stack) > self.max_closers
        key = (mode, aux, deep, stack[len(stack) - self.max_closers:] if deep else stack)
        with self._lock:
            costs = self._cache.get(key)
            if costs is not None:
                self._cache.move_to_end(key)
                return costs
        costs = self._compute(state)
        with self._lock:
            self._cache[key] = costs
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)
        return costs

    def _compute(self, state: State) -> np.ndarray:
        key_costs = np.full(len(self._keys), _REJECTED, dtype=np.int16)
        if _plain_string(state):
            self._string_range(state, 0, 0, len(self._keys), key_costs, len(state[0]))
        else:
            self._walk(state, key_costs)
        costs = np.full(self.size, _REJECTED, dtype=np.int16)
        costs[self._ids] = key_costs[self._id_keys]
        return costs

    def _string_range(self, state: State, offset: int, lo: int, hi: int, key_costs: np.ndarray, depth0: int) -> None:
        """Keys lo..hi, whose first `offset` bytes led to `state` (inside a string, no escape pending):
        plain suffixes at once by their UTF-8 shape, the others by running them."""
        stack, mode, aux = state
        shapes = self._shapes[offset]
        need = _pending_cost(aux)  # type: ignore[arg-type]
        lead, length = shapes.lead[lo:hi], shapes.length[lo:hi]
        completes = (lead == need) & shapes.well_formed[lo:hi]
        continues = (lead < need) & (length == lead)  # only continuation bytes, fewer than needed
        ok = shapes.plain[lo:hi] & (completes | continues)
        left = np.where(lead == need, _CODE_COST[shapes.tail[lo:hi]], need - lead)
        base = (3 if mode == STR_KEY else 1) + len(stack) - depth0
        key_costs[lo:hi][ok] = base + left[ok]
        first, last = np.searchsorted(shapes.special, [lo, hi])
        for k in shapes.special[first:last]:
            end = run(state, self._keys[k][offset:])
            if end is not None:
                key_costs[k] = closing_cost(end) - depth0

    def _walk(self, state: State, key_costs: np.ndarray) -> None:
        """Depth-first over the sorted keys; a rejected byte skips every key under that prefix. A
        first byte that enters a string hands its whole range to the string fast path."""
        keys, depth0 = self._keys, len(state[0])
        todo = [(0, len(keys), 0, state)]
        while todo:
            lo, hi, depth, here = todo.pop()
            if len(keys[lo]) == depth:  # the key spelled by the prefix itself (sorted first)
                key_costs[lo] = closing_cost(here) - depth0
                lo += 1
            i = lo
            while i < hi:
                key = keys[i]
                b = key[depth]
                end = hi if b == 255 else bisect_left(keys, key[:depth] + bytes((b + 1,)), i, hi)
                nxt = step(here, b)
                if nxt is not None:
                    if depth == 0 and _plain_string(nxt):
                        self._string_range(nxt, 1, i, end, key_costs, depth0)
                    else:
                        todo.append((i, end, depth + 1, nxt))
                i = end


def _plain_string(state: State) -> bool:
    """Inside a string with no escape pending and no restricted UTF-8 byte next (the fast path's case)."""
    return (state[1] == STR_KEY or state[1] == STR_VAL) and state[2] in _ANY_CONTINUATION


class JsonConstraint:
    """One request's JSON mode: the automaton state after the tokens so far."""

    def __init__(self, vocab: JsonVocab):
        self.vocab = vocab
        self.state: State = START_STATE

    @property
    def complete(self) -> bool:
        """The object is closed: generation must end here."""
        return self.state[1] == DONE

    def mask(self, remaining: int) -> np.ndarray:
        """Allowed tokens now, `remaining` tokens (this one included) left in the budget."""
        return self.vocab.mask(self.state, remaining)

    def accept(self, token: int) -> None:
        """Advance past a generated token; raises ValueError for a token the mask did not allow."""
        end = run(self.state, self.vocab.token_bytes[token])
        if end is None or not self.vocab.token_bytes[token]:
            raise ValueError(f"token {token} cannot continue the JSON output")
        self.state = end


_VOCABS: weakref.WeakKeyDictionary[Tokenizer, JsonVocab] = weakref.WeakKeyDictionary()
_VOCABS_LOCK = threading.Lock()


def json_vocab(tokenizer: Tokenizer) -> JsonVocab:
    """The tokenizer's `JsonVocab`, built on first use (about a second for a 248K vocabulary)."""
    with _VOCABS_LOCK:
        vocab = _VOCABS.get(tokenizer)
        if vocab is None:
            vocab = _VOCABS[tokenizer] = JsonVocab.from_tokenizer(tokenizer)
        return vocab
