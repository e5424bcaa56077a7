"""Imported at start-up by every Python process of tests/test_dead_rank.py's launches (this folder
is on their PYTHONPATH): SIGUSR2 makes the process raise, as a rank whose own code failed would.
The handler runs at the next Python instruction of the main thread.

It raises only while the rank is at work: in a process group, its main thread not yet exiting,
and once. Anywhere else the raise would not be a rank's failure: Python ignores an exception
raised in an atexit callback (the process exits 0), and a library's `except Exception` during
start-up may swallow it. There the signal is ignored and the test sends it again. (Before this
file ran, SIGUSR2 kills the process: the test signals only a process whose handler is installed;
at exit the signal is ignored before Python finalizes, which would give it back its deadly
default.) The handler writes the moment it raised
(CLOCK_MONOTONIC seconds, as time.monotonic) to the file $RINGDIST_TEST_RAISED_FILE."""
import atexit
import os
import signal
import sys
import threading
import time

_raised = False


def _at_work():
    # Absent until torch.distributed has finished importing.
    is_initialized = getattr(sys.modules.get("torch.distributed"), "is_initialized", None)
    return threading.main_thread().is_alive() and is_initialized is not None and is_initialized()


def _fail(signum, frame):
    global _raised
    if _raised or not _at_work():
        return
    _raised = True
    path = os.environ.get("RINGDIST_TEST_RAISED_FILE")
    if path:
        with open(path + ".part", "w") as f:
            f.write(repr(time.monotonic()))
        os.replace(path + ".part", path)  # the test never reads half a number
    raise RuntimeError("INJECTED FAILURE: this rank raised")


signal.signal(signal.SIGUSR2, _fail)
# Registered first, so it runs last of the atexit callbacks.
atexit.register(signal.signal, signal.SIGUSR2, signal.SIG_IGN)
