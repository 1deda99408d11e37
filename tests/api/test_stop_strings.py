"""Stop strings split across deltas are still caught, and nothing before them is held back for good."""

from engine.generation.serving.stop_strings import StopMatcher


def feed_all(stops, deltas):
    matcher = StopMatcher(stops)
    shown = "".join(matcher.feed(d) for d in deltas)
    return shown + matcher.flush(), matcher.hit


def test_stop_split_across_deltas():
    assert feed_all(["END"], ["abc E", "N", "D more"]) == ("abc ", True)


def test_partial_match_that_fails_is_released():
    matcher = StopMatcher(["END"])
    assert matcher.feed("abc EN") == "abc "
    assert matcher.feed("X") == "ENX"


def test_earliest_of_several_stops_wins():
    assert feed_all(["zz", "b"], ["a", "bzz"]) == ("a", True)


def test_no_stop_means_everything_passes():
    assert feed_all(["END"], ["E", "N"]) == ("EN", False)
    assert feed_all([], ["x", "y"]) == ("xy", False)


def naive_first_stop(stops, text):
    """The reference: the stop string that ends first in `text` (the longest of those ending there), cut at its start."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            return text[: end - max(len(s) for s in ending)], True
    return text, False


def test_the_result_does_not_depend_on_how_the_text_is_cut():
    import random

    rng = random.Random(24)
    for _ in range(300):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        assert feed_all(stops, deltas) == naive_first_stop(stops, text), (stops, deltas)


def test_a_long_self_overlapping_stop_string_is_matched_in_one_pass():
    """'aaa...ab' against a long run of 'a', one character per delta: the old matcher compared every
    prefix of the stop string at every delta (quadratic); the automaton steps once per character."""
    stop = "a" * 1023 + "b"
    matcher = StopMatcher([stop])
    shown = "".join(matcher.feed("a") for _ in range(50_000))
    assert len(shown) == 50_000 - 1023 and not matcher.hit  # only a possible stop's start is held
    assert matcher.feed("b") == "" and matcher.hit
