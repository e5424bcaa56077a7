"""Imported at start-up by every Python process of tests/test_dead_rank.py's launches (this folder
is on their PYTHONPATH): SIGUSR2 makes the process raise, as a rank whose own code failed would.
The handler runs at the next Python instruction of the main thread."""
import signal


def _fail(signum, frame):
    raise RuntimeError("INJECTED FAILURE: this rank raised")


signal.signal(signal.SIGUSR2, _fail)
