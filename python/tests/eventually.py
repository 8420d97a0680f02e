"""Waiting in tests on what can be observed (a state, a count, a log line), never on
time alone; shared by python/tests, tests/s3 and tests/multihost."""

import time


def eventually(condition, what, timeout=30, interval=0.05):
    """The first true value of condition(), polled every `interval` s. After `timeout` s
    without one, AssertionError with `what` (a string, or a function that gives one, called
    then). The timeout is only reached when the code under test is broken."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("not within %g s: %s" % (timeout, what() if callable(what) else what))
        time.sleep(interval)
