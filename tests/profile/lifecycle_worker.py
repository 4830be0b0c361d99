"""A training loop that ends in a chosen way, for the lifecycle tests (tests/profile/test_lifecycle.py): the
Profiler must never change how the run ends (DESIGN.md pitfall 14, STYLE.md habit 17).

    python tests/profile/lifecycle_worker.py FORM STEPS END OUT
        one run, in this process: its exit code and stderr are the run's own (a real uncaught exception, a
        real KeyboardInterrupt)
    python tests/profile/lifecycle_worker.py --matrix FORMS COUNTS ENDS OUT
        torch imported once, then one forked child per case (FORM x STEPS x END); prints one JSON line
        {"FORM STEPS END": exit code (negative: killed by that signal)}; each child's output in OUT/<case>.log

FORM: how the loop drives the profiler -- a key of FORMS ("none": no profiler, the exit code Python gives;
"loop": prof.step() in a plain loop; "with": the same inside `with Profiler(...)`). Another driver (a framework
callback) adds its own entry to FORMS: a function (steps, end, out) that trains `steps` steps and calls
`fail(end)` in the last one. END: "done" (the loop stops after STEPS steps), "raise" (RuntimeError in step
STEPS), "interrupt" (KeyboardInterrupt there), "close" (prof.close() after STEPS steps), "drop" (the Profiler
is dropped inside a function, never closed). COUNTS: "1-20" or "3,10,12".
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import profiling  # noqa: E402


def fail(end):
    """What the last step does for this way of ending."""
    if end == "raise":
        raise RuntimeError("the user's own error")
    if end == "interrupt":
        raise KeyboardInterrupt


def train_step(model, opt):
    loss = model(torch.randn(8, 64)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def no_profiler(steps, end, out):
    model, opt = setup()
    for i in range(steps):
        train_step(model, opt)
        if i == steps - 1:
            fail(end)


def plain_loop(steps, end, out):
    model, opt = setup()
    prof = profiling.Profiler(model, tokens_per_step=64, out_dir=out)
    for i in range(steps):
        train_step(model, opt)
        if i == steps - 1:
            fail(end)
        prof.step()
    if end == "close":
        prof.close()
    return prof


def with_block(steps, end, out):
    model, opt = setup()
    with profiling.Profiler(model, tokens_per_step=64, out_dir=out) as prof:
        for i in range(steps):
            train_step(model, opt)
            if i == steps - 1:
                fail(end)
            prof.step()
    return prof


def dropped(steps, end, out):
    """The Profiler is a local of a function that returns without closing it: collected mid-window."""
    plain_loop(steps, end, out)


FORMS = {"none": no_profiler, "loop": plain_loop, "with": with_block, "drop": dropped}


def counts(text):
    if "-" in text:
        lo, hi = map(int, text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def run_one(form, steps, end, out):
    FORMS[form](steps, end, out)
    print("finished", form, steps, end, flush=True)


def child(form, steps, end, out):
    """In a forked child: run the case, end as the interpreter would (atexit and finalization run)."""
    log = os.open(os.path.join(out, f"{form}-{steps}-{end}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        run_one(form, steps, end, os.path.join(out, "profiles", f"{form}-{steps}-{end}"))
    except BaseException:  # what the interpreter does with an uncaught exception: the traceback, exit 1
        sys.excepthook(*sys.exc_info())
        sys.exit(1)
    sys.exit(0)


def matrix(forms, steps, ends, out):
    import torch._inductor.config  # noqa: F401 (what every child's Profiler imports: once, before the forks)
    import torch.profiler  # noqa: F401
    from profiling.profile import capture, render, summary  # noqa: F401
    codes = {}
    for form in forms.split(","):
        for n in counts(steps):
            for end in ends.split(","):
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    child(form, n, end, out)
                _, status = os.waitpid(pid, 0)
                codes[f"{form} {n} {end}"] = os.waitstatus_to_exitcode(status)
    print(json.dumps(codes))


if __name__ == "__main__":
    if sys.argv[1] == "--matrix":
        matrix(*sys.argv[2:6])
    else:
        form, n, end, out = sys.argv[1:5]
        run_one(form, int(n), end, out)
