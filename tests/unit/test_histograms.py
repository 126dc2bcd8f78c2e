"""The latency histogram puts each observation in the right bucket and reports
Prometheus's cumulative counts."""

from multiraft.runtime.histograms import BUCKETS, Histogram


def test_buckets_are_cumulative_and_bounds_inclusive() -> None:
    histogram = Histogram()
    for seconds in (0.0, 0.0001, 0.0002, 0.003, 20.0):
        histogram.observe(seconds)
    cumulative = dict(histogram.cumulative())
    assert cumulative[repr(0.0001)] == 2, "a bound holds observations equal to it"
    assert cumulative[repr(0.00025)] == 3
    assert cumulative[repr(0.005)] == 4
    assert cumulative[repr(BUCKETS[-1])] == 4 and cumulative["+Inf"] == 5
    assert histogram.count == 5 and abs(histogram.total - 20.0033) < 1e-9


def test_a_histogram_takes_its_own_bounds() -> None:
    # Goal: a histogram of longer tasks (a mirror's verify) keeps its own bounds, in order.
    histogram = Histogram((1.0, 10.0))
    for seconds in (0.5, 1.0, 5.0, 60.0):
        histogram.observe(seconds)
    assert histogram.cumulative() == [("1.0", 2), ("10.0", 3), ("+Inf", 4)]
