"""What ran only in one profiled step, the kind of work it names, and how much of the step that work took: the
evidence irregular.py names a one-off step by, and leaves out on a step under its 2x limit (issue #49 item 1).

Read from what the capture recorded (the trace's operators, annotations and with_stack Python frames; the host
sampler's stacks, profiling/profile/capture/sampler.py), never from the user's script. A frame, operator or
annotation that ran only in step k names a save, an eval or a log by KIND_WORDS. How long that work took:
the share of step k's host samples whose stack holds such a frame times the step's time (HF's checkpoint save
in benchmarks/findings/live/new_user_cpu.py: 3 of the 9 samples of a 22.0 ms step, against 12.6 ms for the
others), or the most time the trace gives one such frame or annotation. Stdlib only.
"""
from profiling.profile.trace import traceio

COMPILE, EVAL, SAVE, LOG = "compile", "eval", "checkpoint save", "log flush"
# words in what ran only in a one-off step (frames, operators, annotations; lower case) that name its kind: the
# compiler's own frames first (a device-only capture records no compile annotation: its host samples show them),
# the checkpoint next (a save evaluates nothing), then the eval (Lightning's and HF's loops: validation_step,
# evaluation_loop, prediction_step; a loop's own evaluate()), then a logging burst (Python's logging, HF's
# on_log, Lightning's loggers and log_metrics, TensorBoard, wandb)
KIND_WORDS = ((COMPILE, ("torch/_dynamo/", "torch/_inductor/", "fake_tensor.py", "compile_fx", "async_compile")),
              (SAVE, ("serialization.py", "save_checkpoint", "checkpoint_connector", "modelcheckpoint",
                      "safetensors", "save_pretrained", "save_model", "save_state")),
              (EVAL, ("evaluat", "validat", "prediction_step", "predict_step", "test_step", "eval_step", "eval_loop")),
              (LOG, ("log_metrics", "log_dict", "on_log", "logging/__init__", "add_scalar", "summarywriter",
                     "tensorboard", "wandb", "flush", "/loggers/")))
# HF's one wrapper around its log, save and eval (`_maybe_log_save_evaluate`) names none of them by itself: its
# "evaluate" would call a log-and-save step an eval; autograd's `autograd::engine::evaluate_function: ...Backward0`
# is the backward, which no eval runs (a training iteration that ran only in one window was named "an eval")
WRAPPERS = ("maybe_log_save_evaluate", "engine::evaluate_function")
MIN_SAMPLES = 2   # host samples of the named work, at least: one sample in a frame is chance (2 ms each,
                  # sampler.INTERVAL_S); HF's save had 3 in each run of
                  # benchmarks/findings/live/new_user_cpu_results.md


def by_step(steps, events):
    """[{name: us}] per step window (start, end, name) of the events (operators, annotations, frames) in it."""
    per, starts = [{} for _ in steps], [w[0] for w in steps]
    for e in events:
        ts = e.get("ts")
        k = traceio.find(steps, starts, ts) if traceio.num(ts) else None
        if k is not None:
            name = str(e.get("name", ""))
            per[k][name] = per[k].get(name, 0.0) + float(e.get("dur") or 0.0)
    return per


def frames_by_step(samples, n):
    """[{frame label: samples}] per profiled step, from the sampler's record (profiling/profile/capture/sampler.py)."""
    per = [{} for _ in range(n)]
    if not isinstance(samples, dict):
        return per
    stacks = samples.get("stacks") or []
    for row in samples.get("samples") or ():
        step, _, stack = row
        if 0 <= step < n and 0 <= stack < len(stacks):
            for depth, label in enumerate(stacks[stack]):  # innermost first: ties go to the innermost frame
                count, inner = per[step].get(label, (0, depth))
                per[step][label] = (count + 1, min(inner, depth))
    return [{label: count - inner / 1e3 for label, (count, inner) in p.items()} for p in per]


def per_step(ix, meta):
    """What each step ran, three ways: [host-sample frames, with_stack Python frames, operators and annotations],
    each a [{label: weight}] per step of ix.steps."""
    steps = ix.steps
    return [frames_by_step(meta.get("host_samples"), len(steps)), by_step(steps, ix.python),
            by_step(steps, ix.cpu_ops + ix.annotations)]


def only_labels(per, k):
    """What ran only in step k, heaviest first (per: `per_step`'s), sampled frames, then Python frames, then
    operators and annotations."""
    out = []
    for p in per:
        others = set().union(*(q for i, q in enumerate(p) if i != k))
        out += sorted((key for key in p[k] if key not in others and " at 0x" not in key), key=lambda key: -p[k][key])
    return out  # (a with_stack name holding an address is one object's, never the same in two steps)


def _words(label):
    text = label.lower()
    for wrapper in WRAPPERS:
        text = text.replace(wrapper, "")
    return text


def kind_of(only):
    """The kind of one-off work the labels name (SAVE, EVAL, LOG), or None."""
    return next((name for name, words in KIND_WORDS if any(w in _words(label) for label in only for w in words)),
                None)


def telling(only, kind):
    """The labels among `only` that name `kind`."""
    words = dict(KIND_WORDS).get(kind, ())
    return [x for x in only if any(w in _words(x) for w in words)]


def named_ms(ix, meta, per, k, labels):
    """How long step k spent in the work `labels` name (labels that ran only in it): the share of its host samples
    whose stack holds one (MIN_SAMPLES of them at least) times its host time, or the most time the trace gives
    one of them (a with_stack frame's, an annotation's, in that step); 0.0 when neither measures it."""
    labels = set(labels)
    traced = max((p[k][x] for p in per[1:] for x in labels if x in p[k]), default=0.0) / 1e3
    host = meta.get("host_samples")
    if not isinstance(host, dict):
        return traced
    stacks = host.get("stacks") or []
    rows = [stack for step, _, stack in host.get("samples") or () if step == k and 0 <= stack < len(stacks)]
    hits = sum(1 for stack in rows if labels.intersection(stacks[stack]))
    a, b, _ = ix.steps[k]
    sampled = hits / len(rows) * (b - a) / 1e3 if hits >= MIN_SAMPLES else 0.0
    return max(traced, sampled)
