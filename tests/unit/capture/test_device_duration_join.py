"""NCCL device durations arrive from NCCL's watchdog thread, before or after the host finishes the row."""

from diag.capture.collectives import DeviceDurationJoin


def test_rows_take_the_device_duration_whichever_half_comes_first():
    written = []
    join = DeviceDurationJoin(lambda entry, duration_us: written.append((entry, duration_us)))
    join.host_done(("0", 1), "host first", 5.0)
    join.device_done(("0", 1), 99.0)
    join.device_done(("0", 2), 77.0)
    join.host_done(("0", 2), "device first", 6.0)
    join.device_done(("1", 3), 1.0)  # a C++-issued collective with no row: kept, never written
    join.host_done(("0", 3), "never timed", 7.0)
    join.drain(wait_s=0.01)
    assert written == [("host first", 99.0), ("device first", 77.0), ("never timed", 7.0)]


def test_unmatched_rows_are_bounded():
    written = []
    join = DeviceDurationJoin(lambda entry, duration_us: written.append(entry))
    join.MAX_WAITING = 3
    for seq in range(5):
        join.host_done(("0", seq), seq, 1.0)
    assert written == [0, 1]  # the oldest are written with their host duration rather than kept forever
