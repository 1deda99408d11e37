"""The fixture tasks: exact token structure, tokenizer round trip through a GGUF vocabulary, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from engine.fixtures.evaluate import MtpCounts
from engine.fixtures.tasks import TASKS, Difficulty, SampleBuilder
from engine.fixtures.vocab import (
    FIXTURE_VOCAB_SIZE,
    TASK_SYMBOLS,
    fixture_tokenizer,
    fixture_vocab,
)
from engine.generation.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def gguf_tokenizer() -> Tokenizer:
    """The runtime tokenizer over the fixture vocabulary exactly as a fixture GGUF stores it."""
    v = fixture_vocab()
    return Tokenizer(v.tokens, v.token_types, v.merges, v.pre, v.special_ids["eos"])


@pytest.fixture(scope="module")
def builder(gguf_tokenizer: Tokenizer) -> SampleBuilder:
    return SampleBuilder(lambda text: gguf_tokenizer.encode(text, parse_special=False))


def test_vocabulary_keeps_task_symbols_single_tokens(gguf_tokenizer: Tokenizer) -> None:
    assert gguf_tokenizer.vocab_size == FIXTURE_VOCAB_SIZE
    assert fixture_tokenizer().merges, "a GGUF gpt2 vocabulary needs merges"
    for c in TASK_SYMBOLS:
        assert len(gguf_tokenizer.encode(c)) == 1, c
    for merge in fixture_tokenizer().merges:  # merges only ever join prose characters
        assert set(merge.replace(" ", "")) <= set("Ġabcdefghijklmnopqrstuvwxyz"), merge


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [160, 300, 1500])
def test_sample_structure_and_round_trip(
    builder: SampleBuilder, gguf_tokenizer: Tokenizer, task: str, length: int
) -> None:
    rng = np.random.default_rng(length)
    for n_queries in (1, 2) if task != "copy" else (1,):
        s = builder.sample(task, rng, length, n_queries)
        assert length - 12 <= len(s.ids) <= length
        assert gguf_tokenizer.encode(s.text, parse_special=False) == s.ids  # pieces encode like the whole text
        assert gguf_tokenizer.decode(s.ids) == s.text
        assert all(s.supervised[s.answer_start :]) and not s.supervised[s.answer_start - 1]
        answers = gguf_tokenizer.decode(s.answer_ids)
        assert answers[-1] in "];>" and answers[:-1].isalnum()
        prompt = gguf_tokenizer.decode(s.prompt_ids)
        if task == "recall":
            key = prompt[prompt.rindex("?") + 1 : -1]
            assert f"[{key}={answers}" in prompt
        elif task == "copy":
            assert prompt.endswith("\n<") and f"<{answers}" in prompt
        else:
            a, b = prompt[prompt.rindex("\n") + 1 : -1].split("+")
            assert int(answers[:-1]) == int(a) + int(b)
        assert sum(s.supervised) >= n_queries * 2


def test_samples_are_deterministic(builder: SampleBuilder) -> None:
    a = builder.sample("recall", np.random.default_rng(5), 500, 3)
    b = builder.sample("recall", np.random.default_rng(5), 500, 3)
    assert a == b


def test_difficulty_ramps_from_one_pair_and_short_strings_to_the_evaluated_tasks() -> None:
    assert Difficulty.at(0.0) == Difficulty(max_pairs=1, copy_lengths=(8, 8))
    assert Difficulty.at(1.0) == Difficulty.at(7.0) == Difficulty()
    ramp = [Difficulty.at(p / 10) for p in range(11)]
    assert all(a.max_pairs <= b.max_pairs and a.copy_lengths[1] <= b.copy_lengths[1] for a, b in zip(ramp, ramp[1:]))


def _period(words: list[str]) -> int | None:
    """The shortest period of at most 32 words, if the word sequence has one."""
    return next((p for p in range(1, 33) if all(words[i] == words[i + p] for i in range(len(words) - p))), None)


def test_easy_items_and_repeated_prose(builder: SampleBuilder, gguf_tokenizer: Tokenizer) -> None:
    easy = SampleBuilder(builder.encode, Difficulty(max_pairs=1, copy_lengths=(8, 8), repeat_prose=True))
    rng = np.random.default_rng(3)
    for _ in range(5):
        assert easy.sample("recall", rng, 400).text.count("[") == 1
        assert len(gguf_tokenizer.decode(easy.sample("copy", rng, 400).answer_ids)) == 9  # 8 symbols and ">"
        prose = easy.sample("arith", rng, 400).text.rsplit("\n", 1)[0].split()
        assert len(prose) > 64 and _period(prose) is not None
        plain = builder.sample("arith", rng, 400).text.rsplit("\n", 1)[0].split()
        assert len(plain) > 64 and _period(plain) is None


def test_default_difficulty_draws_what_the_plain_builder_drew(builder: SampleBuilder, gguf_tokenizer: Tokenizer) -> None:
    """The evaluated samples must not change with the training options: the same seed gives the same sample."""
    explicit = SampleBuilder(lambda text: gguf_tokenizer.encode(text, parse_special=False), Difficulty())
    for task in TASKS:
        assert explicit.sample(task, np.random.default_rng(9), 600) == builder.sample(task, np.random.default_rng(9), 600)


def test_bad_requests(builder: SampleBuilder) -> None:
    with pytest.raises(ValueError, match="unknown task"):
        builder.sample("sort", np.random.default_rng(0), 100)
    with pytest.raises(ValueError, match="too short"):
        builder.sample("copy", np.random.default_rng(0), 10)


def test_mtp_verify_replay() -> None:
    counts = MtpCounts()
    counts.add([True, True, False, True])  # verify 1 takes tokens 1-2, verify 2 token 3, verify 3 token 4
    counts.add([False])
    s = counts.summary()
    assert (counts.drafts, counts.accepted, counts.verifies, counts.verified_tokens) == (5, 3, 4, 5)
    assert s["acceptance"] == 0.6 and s["tokens_per_verify"] == 1.25
