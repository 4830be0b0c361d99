"""CUPTI kept through the capture's own profiler sessions and released after the last (issue #50).

kineto finalizes CUPTI after a session only where TEARDOWN_CUPTI=1; otherwise CUPTI's callbacks stay on every CUDA
launch for the rest of the process (pytorch/pytorch#144455). Measured on the H100
(benchmarks/profiler_cost/capture_cost_results.md section 4): an eager 12-layer GPT ran 19-22 ms a step before
a bare torch.profiler session with CUDA activity and 31-43 ms after it, and as fast as before with the
variable set.

kineto reads the variable when a session is configured and when one ends, tears CUPTI down from a thread of its
own, finalizes it in the next CUDA call's callback, and then, unless the variable still says "1", subscribes
CUPTI's callbacks again. So:
- through the capture's sessions it is "0": set for all of them, the window's session tore CUPTI down as the
  untimed detail step's was configured, and that step recorded no CUDA activity to join (0% of device time);
- after the last session it is "1", and an empty CPU-only session's configuration starts the teardown (the
  finalize runs in the loop's next CUDA call);
- it stays "1" for the rest of the process where the user had not set it (put back to unset, the teardown's
  end would subscribe the callbacks again): the profiler's own setting, in the report's settings line.
Not released where CUPTI must stay: the user's own TEARDOWN_CUPTI=0, and CUDA graphs on a CUDA where their CUPTI
re-initialization crashes (torch.profiler then sets DISABLE_CUPTI_LAZY_REINIT=1 and TEARDOWN_CUPTI=0 itself).
"""
import contextlib
import os
import warnings

VAR = "TEARDOWN_CUPTI"
GRAPHS = "DISABLE_CUPTI_LAZY_REINIT"  # torch.profiler's mark that CUDA graphs need CUPTI kept


class Hold:
    """Created before the capture's first session (CUDA only); release() once after its last (again: nothing).
    `sets`: whether the profiler leaves TEARDOWN_CUPTI=1 where the user had no value."""

    def __init__(self):
        self.user = os.environ.get(VAR)   # the user's own value (None: unset)
        self.held = self.user != "0"
        self.sets = self.user is None
        if self.held:
            os.environ[VAR] = "0"

    def release(self):
        if not self.held:
            return
        self.held = False
        if os.environ.get(GRAPHS) == "1":  # CUDA graphs that need CUPTI: the user's value back, nothing released
            self.sets = False
            if self.user is None:
                os.environ.pop(VAR, None)
            else:
                os.environ[VAR] = self.user
            return
        from torch.profiler import ProfilerActivity, profile
        os.environ[VAR] = "1"
        with contextlib.suppress(Exception), warnings.catch_warnings():  # never stops the run
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CPU]):
                pass
