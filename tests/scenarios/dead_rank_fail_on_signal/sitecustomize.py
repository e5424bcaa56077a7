"""Imported at start-up by every Python process of tests/test_dead_rank.py's launches (this folder
is on their PYTHONPATH): SIGUSR2 makes the rank raise in its own code, as a rank whose script
failed would.

The signal's handler runs at the next Python instruction of the main thread, wherever that is:
in torch, in Lightning, in a library whose `except Exception` would swallow the error. So the
handler only arms the failure, and the exception is raised at the next line or call of the
script itself (sys.argv[0]: the example, the bench's module, the sweep), through a trace
function on the main thread.

The failure is armed only while the rank is at work: in a process group, its main thread not yet
exiting; it is raised once. Anywhere else the raise would not be a rank's failure (Python ignores an
exception raised in an atexit callback: the process exits 0), so there the signal is ignored and
the test sends it again. Before this file ran SIGUSR2 kills the process: the test signals only a
process whose handler is installed; at exit the signal is ignored before Python finalizes,
which would give it back its deadly default. At the raise the moment (CLOCK_MONOTONIC seconds,
as time.monotonic) is written to the file $RINGDIST_TEST_RAISED_FILE."""
import atexit
import os
import signal
import sys
import threading
import time

_raised = False
_in_script = {}  # code file name -> is it the script's


def _at_work():
    # Absent until torch.distributed has finished importing.
    is_initialized = getattr(sys.modules.get("torch.distributed"), "is_initialized", None)
    return threading.main_thread().is_alive() and is_initialized is not None and is_initialized()


def _script(frame):
    name = frame.f_code.co_filename
    if name not in _in_script:
        script = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
        _in_script[name] = script is not None and os.path.realpath(name) == script
    return _in_script[name]


def _raise(frame, event, arg):
    """The trace function: on the script's next line (an active frame) or call (a new one)."""
    global _raised
    if not _script(frame):
        return None
    _raised = True
    path = os.environ.get("RINGDIST_TEST_RAISED_FILE")
    if path:
        with open(path + ".part", "w") as f:
            f.write(repr(time.monotonic()))
        os.replace(path + ".part", path)  # the test never reads half a number
    raise RuntimeError("INJECTED FAILURE: this rank raised")  # and Python stops tracing


def _arm(signum, frame):
    if _raised or not _at_work():
        return
    while frame is not None:
        if _script(frame):
            frame.f_trace = _raise
            frame.f_trace_lines = True
        frame = frame.f_back
    sys.settrace(_raise)


signal.signal(signal.SIGUSR2, _arm)
# Registered first, so it runs last of the atexit callbacks.
atexit.register(signal.signal, signal.SIGUSR2, signal.SIG_IGN)
