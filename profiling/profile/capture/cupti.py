"""CUPTI kept through the capture's own profiler sessions and released after the last (issue #50).

kineto finalizes CUPTI when a session ends only where TEARDOWN_CUPTI=1 (read when a session ends and when the next
one is configured); otherwise CUPTI's callbacks stay on every CUDA launch for the rest of the process
(pytorch/pytorch#144455). Measured on the H100 (benchmarks/capture_cost_results.md): an eager 12-layer GPT ran
16-25 ms a step before a profile and 30-43 ms after one, after bare torch.profiler's sessions as after this
profiler's, and as fast as before with the variable set. Set for the whole capture it would cost the capture
itself: the window's session would tear CUPTI down as the untimed detail step starts, and that step then records
no CUDA activity for the join (0% of device time joined). So the capture holds it at "0" through its own sessions,
releases CUPTI after the last one (an empty CPU-only session, whose configuration tears the previous one down;
the finalize itself runs in the loop's next CUDA call), and puts the user's value back.

Not released where CUPTI must stay: the user's own TEARDOWN_CUPTI=0, and CUDA graphs on a CUDA where their CUPTI
re-initialization crashes (torch.profiler then sets DISABLE_CUPTI_LAZY_REINIT=1 and TEARDOWN_CUPTI=0 itself).
"""
import contextlib
import os
import warnings

VAR = "TEARDOWN_CUPTI"
GRAPHS = "DISABLE_CUPTI_LAZY_REINIT"  # torch.profiler's mark that CUDA graphs need CUPTI kept


class Hold:
    """Created before the capture's first session (CUDA only); release() once after its last (again: nothing)."""

    def __init__(self):
        self.user = os.environ.get(VAR)   # the user's own value (None: unset), put back by release()
        self.held = self.user != "0"
        if self.held:
            os.environ[VAR] = "0"

    def release(self):
        if not self.held:
            return
        self.held = False
        try:
            if os.environ.get(GRAPHS) != "1":
                from torch.profiler import ProfilerActivity, profile
                os.environ[VAR] = "1"
                with contextlib.suppress(Exception), warnings.catch_warnings():  # never stops the run
                    warnings.simplefilter("ignore")
                    with profile(activities=[ProfilerActivity.CPU]):
                        pass
        finally:
            if self.user is None:
                os.environ.pop(VAR, None)
            else:
                os.environ[VAR] = self.user
