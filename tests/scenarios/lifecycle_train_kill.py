"""Runs examples/train_ddp.py unchanged, except that one worker SIGKILLs itself at a given
optimizer step of the first torchrun attempt (test-only; the example is not edited).

    torchrun ... tests/scenarios/lifecycle_train_kill.py <train_ddp.py arguments>

FT_KILL_RANK   global rank that dies (default 1)
FT_KILL_STEP   optimizer step (1-based, counted in this process) at which it dies
FT_KILL_MARK   file written just before the kill (proves the kill happened)
FT_RESTART_DELAY_RANK0
               seconds rank 0 waits before starting on a restarted attempt (a node that
               comes back slower than the others, as on a real cluster); default 0
FT_PG_TIMEOUT_S
               default process-group timeout the example's init_process_group() gets (it
               passes none, so torch's 30 min default would apply); keeps a hung init short

Only the attempt with TORCHELASTIC_RESTART_COUNT=0 kills itself; the restarted attempt
runs normally and must resume from the example's --checkpoint.
"""
import os
import runpy
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "train_ddp.py")


def _arm_kill():
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if os.environ.get("RANK") != os.environ.get("FT_KILL_RANK", "1"):
        return
    kill_step = int(os.environ["FT_KILL_STEP"])
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps = [0]

    def hook(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == kill_step:
            mark = os.environ.get("FT_KILL_MARK")
            if mark:
                with open(mark, "w") as f:
                    f.write(f"rank {os.environ['RANK']} killed at step {kill_step}\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(hook)


def _die_with_agent():
    # torchrun starts workers in their own sessions: if the agent is killed (test timeout),
    # its workers must not live on.
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


if __name__ == "__main__":
    _die_with_agent()
    _arm_kill()
    if os.environ.get("FT_PG_TIMEOUT_S"):
        import datetime

        import torch.distributed.distributed_c10d as c10d

        c10d.default_pg_timeout = datetime.timedelta(seconds=float(os.environ["FT_PG_TIMEOUT_S"]))
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and os.environ.get("RANK") == "0":
        import time

        time.sleep(float(os.environ.get("FT_RESTART_DELAY_RANK0", "0")))
    sys.argv = [EXAMPLE] + sys.argv[1:]
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    runpy.run_path(EXAMPLE, run_name="__main__")
