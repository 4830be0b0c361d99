"""#57's traces of public, unmodified pytorch/examples scripts (tests/data/foreign/pub-examples-*, SOURCES.md;
verdicts in benchmarks/findings/corpus/foreign_results.md, "#57: 20 traces of public scripts"): imagenet
(--dummy), word_language_model and dcgan (fake data) on an H200, profiled from the process's start with no
schedule (cold), with CPU activity only (cpuactivity) or with Python stacks (stack-cold). Each assertion names
the trace's own evidence a verdict rests on, so a rule that drifts fails here; the strict xfails are the wrong
verdicts' causes, and pass (so fail, strict) once a rule is fixed: then drop their mark."""
import os

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.trace import only_in_step

FOREIGN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "foreign")
NAMES = sorted(n[:-len(".json.gz")] for n in os.listdir(FOREIGN)
               if n.startswith("pub-examples-") and n.endswith(".json.gz"))
COLD = [n for n in NAMES if n.endswith("-cold-no-steps")]  # cold and stack-cold
CPU = [n for n in NAMES if n.endswith("-cpuactivity-no-steps")]
WARM = [n for n in NAMES if n.endswith("-warm-no-steps")]  # after 10 iterations (make_public_traces_57.py `warm`)
COLD_CALL = "cold first pass"


def kinds(s):
    return [f["kind"] for f in s["findings"]]


def test_the_20_public_script_traces_are_there_and_described():
    """Issue #57 asked for 20 public traces of its kinds: 12 from the process's first call (cold, 4 of them
    with Python stacks), 8 with CPU activity only; then 4 warm ones; SOURCES.md describes each."""
    assert (len(NAMES), len(COLD), len(CPU), len(WARM)) == (24, 12, 8, 4)
    with open(os.path.join(FOREIGN, "SOURCES.md")) as f:
        sources = f.read()
    assert [n for n in NAMES if f"{n}.json.gz" not in sources] == []


@pytest.mark.parametrize("name", NAMES)
def test_each_summarizes_and_its_findings_fit_in_the_step(name, foreign):
    s = foreign(name)
    assert s["steps"] >= 1 and s["step_ms"] > 0
    assert sum(f["ms_per_step"] for f in s["findings"]) <= s["step_ms"] + 1e-6
    assert to_markdown(s)


# ---------------------------------------------------------------------------------------------------------
# A process profiled from its start: its cold start said once, priced per step by nothing

@pytest.mark.parametrize("name", COLD)
def test_the_cold_start_is_said_once_and_left_out_of_the_step(name, foreign):
    """One window (no iteration found: the trim left one iteration, or the loop has no optimizer and no
    DataLoader, as word_language_model's hand-written SGD): its first calls are one one-off line and their GPU
    idle is in no finding. A loop found by the optimizer's step: its first iteration, 5-70x the like ones, is
    left out as a cold first pass."""
    s = foreign(name)
    cold = [r for r in s["one_off"] if r["kind"] == COLD_CALL]
    assert len(cold) == 1
    if cold[0]["step"] is None:
        assert s["window"] == "whole trace"
        assert "`cudaFuncGetAttributes`" in cold[0]["text"] and "first kernel launches" in cold[0]["text"]
        assert sum(f["ms_per_step"] for f in s["findings"]) < s["step_ms"] - cold[0]["ms"]
    else:
        assert s["iterations"]["by"] == "the optimizer's step"
        assert cold[0]["position"] == 1 and cold[0]["ms"] > 5 * s["step_ms"]


def test_the_resnet18_loop_from_its_first_call_is_the_hosts_dispatch(foreign):
    """imagenet ResNet-18 (batch 32, SGD, DataParallel on one GPU): 3 iterations by SGD's step, the first
    (2.25 s: the workers' first batch, cuDNN's and cuBLAS's set-up) left out; the like ones run ~420 kernels
    on ~7.9 ms of GPU against 20-45 ms of host: launch_bound leads, its fix compiling (right, partial: the
    45 ms one still holds SGD's first momentum `_foreach_mul_`)."""
    s = foreign("pub-examples-imagenet-resnet18-cold-no-steps")
    assert s["iterations"]["count"] == 3 and s["steps"] == 2
    assert s["device_ms"] < 0.3 * s["step_ms"]
    top = s["findings"][0]
    assert top["kind"] == "launch_bound" and "torch.compile" in top["fix"]


@pytest.mark.parametrize("model", ["lstm", "gru", "transformer"])
def test_word_language_models_dispatch_leads_once_their_cold_pass_is_out(model, foreign):
    """word_language_model updates its parameters by hand (no optimizer) and reads no DataLoader: one window
    of the data's copies, a cold first iteration and about one warm one (1.3-2.2 ms of GPU against ~9-10 ms of
    host). With the cold start said once, launch_bound leads (right, partial: part of its gaps are the cold
    iteration's); the gpu_waits_on_host left is under 1% of the window. No marker tells how many iterations the
    window holds, so it is not read as one first iteration (as imagenet's below)."""
    s = foreign(f"pub-examples-wlm-{model}-cold-no-steps")
    assert s["window"] == "whole trace" and kinds(s)[0] == "launch_bound"
    assert not [r for r in s["one_off"] if "one iteration of the loop" in r["text"]]
    waits = [f for f in s["findings"] if f["kind"] == "gpu_waits_on_host"]
    assert all(f["ms_per_step"] < 0.01 * s["step_ms"] for f in waits)


# ---------------------------------------------------------------------------------------------------------
# A CUDA model recorded with CPU activity only

GPU_ONLY = {"imagenet": "`aten::cudnn_convolution`", "dcgan": "`aten::cudnn_convolution`",
            "wlm-lstm": "`aten::_cudnn_rnn_backward`", "wlm-gru": "`aten::_cudnn_rnn_backward`",
            "wlm-transformer": "`aten::_efficient_attention_forward`"}


@pytest.mark.parametrize("name", CPU)
def test_cpu_activity_of_a_cuda_model_says_so_and_claims_nothing(name, foreign):
    """activities=[CPU] around a model on the H200: no kernel events; the operators only a GPU runs (cuDNN's
    convolutions and RNN backward, memory-efficient attention) say it, no CPU rule prices the host's dispatch,
    and the report asks for ProfilerActivity.CUDA."""
    s = foreign(name)
    op = next(v for k, v in GPU_ONLY.items() if name.startswith(f"pub-examples-{k}-"))
    assert s["kind"] == "cpu" and not s["findings"]
    text = s["no_findings"]
    assert "this CUDA model's operators ran with CPU activity only" in text and op in text
    assert "ProfilerActivity.CUDA" in text


# ---------------------------------------------------------------------------------------------------------
# What the wrong verdicts rest on (strict xfails: a fix makes them pass)

def test_a_backward_is_no_eval():
    """only_in_step's EVAL word 'evaluat' matched autograd's `autograd::engine::evaluate_function: ...`, which every
    backward runs."""
    evaluate = "autograd::engine::evaluate_function: ConvolutionBackward0"
    assert only_in_step.kind_of([evaluate]) != only_in_step.EVAL


@pytest.mark.parametrize("arch", ["resnet50", "mobilenetv3small"])
def test_the_training_iteration_is_not_named_an_eval(arch, foreign):
    """imagenet with CPU activity, trimmed in the second iteration's forward: two iterations by the
    DataLoader's next batch; the first, the only one with a backward and SGD's step, was left out as 'an eval'
    (the word above), and the second's 19-22 ms forward fragment is the like step."""
    s = foreign(f"pub-examples-imagenet-{arch}-cpuactivity-no-steps")
    first = [r for r in s["one_off"] if r.get("position") == 1]
    assert first and first[0]["kind"] != "eval"


@pytest.mark.parametrize("arch", ["resnet50", "mobilenetv3small"])
def test_the_workers_start_up_in_a_one_batch_window_is_no_step_cost(arch, foreign):
    """The stack-cold imagenet windows hold the first iteration only (one `__next__` of 182-188 ms, the
    workers starting; the trim cut the backward): their top was input_bound with 'more workers'; the later
    batches of the same loop (resnet18-cold) waited 0.1 ms. Now a one-off: the loader not yet steady."""
    s = foreign(f"pub-examples-imagenet-{arch}-stack-cold-no-steps")
    assert "input_bound" not in kinds(s)
    (row,) = [r for r in s["one_off"] if r["kind"] == "loader not yet steady"]
    assert row["ms"] > 150 and "the workers' start" in row["text"] and "profile later" in row["text"], row


@pytest.mark.parametrize("arch", ["resnet50", "mobilenetv3small"])
def test_a_first_iteration_window_has_no_unknown_host_wait(arch, foreign):
    """cold.first_calls took an operator's first call by name only: cuDNN's set-up for each new convolution shape
    (108-139 ms for one, 3-4 ms for others) stayed GPU idle that gpu_waits_on_host priced, 'cause unknown'; it takes
    the first call on each operator's shapes now."""
    s = foreign(f"pub-examples-imagenet-{arch}-cold-no-steps")
    waits = [f for f in s["findings"] if f["kind"] == "gpu_waits_on_host"]
    assert not [f for f in waits if f["ms_per_step"] > 0.1 * s["step_ms"]]


@pytest.mark.parametrize("arch", ["resnet50", "mobilenetv3small", "densenet121"])
def test_a_window_of_one_first_iteration_prices_no_step(arch, foreign):
    """imagenet cold, trimmed inside its first iteration (one DataLoader batch, no second): every host-paced gap
    is that first pass's (first launches under the cold thresholds, model.cuda()'s copies, DenseNet's trimmed
    parent span), which launch_bound (69-245 ms/step), cuda_sync and gpu_waits_on_host priced per step; now the
    cold row says the window is one iteration and no finding takes 1% of the step."""
    s = foreign(f"pub-examples-imagenet-{arch}-cold-no-steps")
    (row,) = [r for r in s["one_off"] if r["kind"] == COLD_CALL]
    assert "it holds one iteration of the loop (the DataLoader's next batch recorded once)" in row["text"], row
    assert [f["kind"] for f in s["findings"] if f["ms_per_step"] >= 0.01 * s["step_ms"]] == []
    assert [r for r in s["one_off"] if r["kind"] == "loader not yet steady"]



def test_a_gans_two_optimizer_steps_a_batch_make_one_iteration(foreign):
    """dcgan updates netD then netG for each batch (two `Optimizer.step#Adam.step` a batch): by the optimizer's
    step each iteration was two "steps" (the D half, the G half; like steps of 225, 202 and 5.6 ms); by the
    DataLoader's batch, the iteration is whole."""
    s = foreign("pub-examples-dcgan-fake-cpuactivity-no-steps")
    assert s["iterations"]["by"] == "the DataLoader's next batch", s["iterations"]


@pytest.mark.parametrize("variant", ["cold", "stack-cold"])
def test_cudnn_benchmarks_first_calls_are_the_cold_pass_not_alloc_churn_or_syncs(variant, foreign):
    """dcgan with cudnn.benchmark, trimmed in its first iteration: each new convolution shape's first call builds
    and times cuDNN's candidates (879 ms of host in one `convolution_backward`, a few syncs among them). With
    those syncs the cold rule took none of it, and the window priced alloc_churn 1,050 ms/step (the candidates'
    workspaces) or host_sync (their timing syncs); now the first calls are the cold pass, said once."""
    s = foreign(f"pub-examples-dcgan-fake-{variant}-no-steps")
    (row,) = [r for r in s["one_off"] if r["kind"] == COLD_CALL]
    assert "the first `aten::convolution_backward`" in row["text"] and row["ms"] > 0.7 * s["step_ms"], row
    assert not {"alloc_churn", "host_sync", "gpu_waits_on_host"} & {
        f["kind"] for f in s["findings"] if f["ms_per_step"] >= 0.01 * s["step_ms"]}


# ---------------------------------------------------------------------------------------------------------
# Warm windows of the same scripts (after 10 iterations): their iterations read from what the loop records

def test_a_warm_gan_window_is_its_batches_each_with_both_updates(foreign):
    """dcgan warm: the window begins inside iteration 10 (its two optimizer steps before the first batch in it),
    then 4 whole iterations, then the epoch's last batch arriving as it ends (3 device events: its copy). By
    the optimizer's step it read 9 half-iterations of 12.4 ms; by the batch, 4 of ~26 ms, the cut one said once."""
    s = foreign("pub-examples-dcgan-fake-warm-no-steps")
    assert s["iterations"]["by"] == "the DataLoader's next batch" and s["steps"] == 4, s["iterations"]
    (cut,) = [r for r in s["one_off"] if r["kind"] == "cut by the window's end"]
    assert "3 device events against the others' median of 398" in cut["text"], cut
    assert all(c["ok"] for c in s["checks"] if c["name"] in ("device events per step", "profiled steps alike"))
    assert 20 < s["step_ms"] < 35


@pytest.mark.parametrize("model", ["lstm", "transformer"])
def test_a_loop_with_no_marker_is_read_by_its_losss_backward(model, foreign):
    """word_language_model warm records no optimizer step, DataLoader or module scope: its 5 iterations are read
    from the autograd thread, where each backward begins with the loss's node; before, the window was one
    "step" of 5 iterations (60-69 ms)."""
    s = foreign(f"pub-examples-wlm-{model}-warm-no-steps")
    assert s["iterations"]["by"] == "the operators' sequence", s["iterations"]
    assert s["iterations"]["marker"] == "autograd::engine::evaluate_function: NllLossBackward0"
    assert s["steps"] >= 4 and s["step_ms"] < 20


def test_a_warm_imagenet_window_is_read_by_its_optimizer(foreign):
    s = foreign("pub-examples-imagenet-resnet18-warm-no-steps")
    assert s["iterations"]["by"] == "the optimizer's step" and s["steps"] >= 3
    assert not s["one_off"] or all(r["kind"] != "cold first pass" for r in s["one_off"])



def test_a_warm_imagenets_bursty_loader_leads_priced_near_what_more_workers_saved(foreign):
    """imagenet ResNet-18 warm, 2 workers: next-batch waits of 30, 0.1, 5, 0.1 ms in the window's iterations and 21
    after the last (the next iteration's, cut). The 30 ms iteration also logged (4 `.item()`): it was left out as
    "work added", and the rest read as a queue filling ("not yet steady"); input_bound was 1.24 ms/step, third
    behind compiling. Timed on the same H200 model unprofiled (time_public_fixes.py): `-j 4` instead of `-j 2`
    took 28.4 -> 16.6 ms an iteration. Now the iteration stays (its extra time is the wait), the pattern is read
    with the batch after the last step (bursts), and input_bound leads at the window's mean."""
    s = foreign("pub-examples-imagenet-resnet18-warm-no-steps")
    top = s["findings"][0]
    assert top["kind"] == "input_bound" and "more of them" in top["fix"], top
    assert 0.5 * 11.85 <= top["ms_per_step"] <= 1.5 * 11.85, top["ms_per_step"]
    assert "(after the last step: 21.0)" in top["evidence"] and "uneven" in top["evidence"]
