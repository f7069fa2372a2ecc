"""Which pass measured a number: every capture level has a caption, and the captions say the same thing everywhere."""

from prefillviz.instrument.passes import PASSES, median_of_passes, pass_label
from prefillviz.instrument.records import CAPTURE_LEVELS


def test_every_capture_level_names_its_pass():
    assert set(PASSES) == set(CAPTURE_LEVELS)
    assert pass_label("none") == "timing pass (nothing captured)"
    assert pass_label("inspect") == "inspection pass (KV log, q/k captured; slower)"
    assert pass_label("profile", short=True) == "under torch.profiler"


def test_a_median_says_how_many_passes():
    assert pass_label("timing", 5) == "timing pass (per-layer clocks, median of 5)"
    assert pass_label("timing", 5, short=True) == "timing pass, median of 5"
    assert median_of_passes(5) == "median of 5 timing passes"
    assert median_of_passes(1) == "median of 1 timing pass"
