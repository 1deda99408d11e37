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
