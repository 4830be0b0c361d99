"""Issue #57's kinds of trace in the corpus (tests/data/foreign/own-h200-*, SOURCES.md; verdicts in
benchmarks/findings/corpus/foreign_results.md): windows and iterations from what the trace holds, a model's first
calls said once, a device that ran without its events, a GPU left unused. Each assertion names the trace's own
evidence, so a rule that drifts back fails here."""
import os

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import summarize
from profiling.profile.trace import device_work

FOREIGN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "foreign")


@pytest.fixture(scope="module")
def own(foreign):
    """own(name) -> the summary of tests/data/foreign/own-h200-<name>.json.gz (made once per run)."""
    return lambda name: foreign(f"own-h200-{name}")


def test_the_corpus_holds_57s_kinds():
    """#57's acceptance: at least 20 traces of these kinds, each described in SOURCES.md."""
    names = [n for n in os.listdir(FOREIGN) if n.startswith("own-h200-")]
    by_kind = {k: sum(n.startswith(f"own-h200-{k}-") for n in names)
               for k in ("cold", "nomarkers", "cpuactivity", "modeloncpu")}
    assert sum(by_kind.values()) >= 20 and all(by_kind.values()), by_kind
    with open(os.path.join(FOREIGN, "SOURCES.md")) as f:
        sources = f.read()
    assert all(n in sources for n in names)


def kinds(s):
    return [f["kind"] for f in s["findings"]]


# ---------------------------------------------------------------------------------------------------------
# Without markers, the window covers the host's work as well as the GPU's

@pytest.mark.parametrize("name, waits_ms", [("nomarkers-resnet18-loader-0-workers", 40),
                                            ("nomarkers-vit-inference-eval-loader", 150)])
def test_a_loop_without_markers_keeps_the_host_time_its_loader_took(name, waits_ms, own):
    """A 0-worker DataLoader whose Dataset decodes in Python: the iterations span the host's waits for each batch
    (before the first kernel too), and input_bound prices them (a GPU-span window once read the ViT eval's
    1,172 ms of host activity as 1,028 ms, the first batch's 142 ms before any kernel left out)."""
    s = own(name)
    assert s["iterations"]["by"] in ("the optimizer's step", "the DataLoader's next batch")
    top = s["findings"][0]
    assert top["kind"] == "input_bound" and top["ms_per_step"] >= waits_ms
    assert "num_workers=0" in top["evidence"] and "num_workers=N" in top["fix"]


def loader_loop(batches):
    """A loop without markers: each batch a DataLoader `__next__` of 5 ms, then one 1 ms kernel; the loop's last
    `__next__` (StopIteration) launches nothing."""
    evs, t = [], 0
    for k in range(batches + 1):
        evs.append({"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter"
                    ".__next__", "pid": 1, "tid": 1, "ts": t, "dur": 5000 if k < batches else 200})
        if k < batches:
            evs += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 5100, "dur": 30},
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 5110,
                     "dur": 5, "args": {"correlation": k + 1}},
                    {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7,
                     "ts": t + 5120, "dur": 1000, "args": {"correlation": k + 1}}]
        t += 6200
    return {"traceEvents": evs, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_the_loops_last_next_call_is_no_iteration():
    """A loop's last `__next__` raises StopIteration and launches nothing: it is merged into the iteration before
    it, not a step of its own (a ViT eval's 6 batches of 150-290 ms read as 7 iterations, the 7th 0.2 ms), and the
    host's first 5 ms before any kernel are the first iteration's."""
    s = summarize(loader_loop(4))
    assert s["steps"] == 4 and s["iterations"]["count"] == 4 and not s["one_off"]
    assert s["step_ms"] == pytest.approx((4 * 6200 + 200 - 80) / 4 / 1e3, rel=0.02)
    assert s["findings"][0]["kind"] == "input_bound"


def test_host_work_between_iterations_stays_in_them(own):
    """10 SGD steps of an MLP with 150 ms of host work after each (`.cpu()` of the loss, then Python): the
    iterations come from the optimizer's step whatever the host did between them; none is left out as a one-off,
    and the idle is the GPU waiting on the host, its cause unknown (no host samples)."""
    s = own("nomarkers-mlp-sleepy-host-loop")
    assert s["steps"] == 10 and not s["one_off"]
    top = s["findings"][0]
    assert top["kind"] == "gpu_waits_on_host" and top["pct_of_step"] > 90 and "cause unknown" in top["evidence"]


def forward_loop(gaps_ms):
    """A loop of forwards without markers (with_stack's module scope marks each), one 2 ms kernel each, the host
    working `gaps_ms[k]` ms after forward k (post-processing: nothing recorded)."""
    evs, t = [], 0
    for k, gap in enumerate(gaps_ms):
        evs += [{"ph": "X", "cat": "python_function", "name": "nn.Module: Net_0", "pid": 1, "tid": 1, "ts": t,
                 "dur": 300},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 10, "dur": 200},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 20,
                 "dur": 5, "args": {"correlation": k + 1}},
                {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": t + 30,
                 "dur": 2000, "args": {"correlation": k + 1}}]
        t += 2100 + gap * 1000
    return {"traceEvents": evs, "deviceProperties": [{"name": "NVIDIA H200"}]}


def test_iterations_keep_the_hosts_time_between_them():
    """Ten forwards, the host's time after them 3 ms but 9-15 ms after four: the same kernel in each, so the slow
    ones are the loop's own (the host's time between iterations), not one-offs (#57: 4 of 9 forwards left out, 267.5
    ms reported where the mean forward was ~436)."""
    gaps = [3, 3, 12, 3, 15, 3, 9, 3, 14, 3]
    s = summarize(forward_loop(gaps))
    assert s["iterations"]["by"] == "the model's forward" and s["steps"] == 10 and not s["one_off"]
    total = sum(2.1 + g for g in gaps[:-1]) + 2.0
    assert s["step_ms"] == pytest.approx(total / 10, rel=0.02)
    assert any("the host's work between iterations is the loop's own" in n for n in s["notes"])


def test_a_public_one_window_trace_takes_in_the_host_after_its_last_kernel(data_summary):
    """HTA's A100 simple-add benchmark: 439 ms of the host after the last kernel (cudaFree 311 ms): the window is
    the host's 792 ms, no longer the GPU's 353 ms, and the idle there is a gap the host was in (the window's
    end)."""
    s = data_summary(os.path.join(FOREIGN, "hta-a100-simple-add-no-steps.json.gz"))
    assert s["window"] == "whole trace" and s["step_ms"] == pytest.approx(792.1, abs=0.5)
    top = s["findings"][0]
    assert top["kind"] == "gpu_waits_on_host" and "cudaFree" in top["evidence"]


# ---------------------------------------------------------------------------------------------------------
# A model's first calls: said once, priced per step by nothing

@pytest.mark.parametrize("name, calls", [("cold-mlp-first-call-no-steps", "`cudaFuncGetAttributes`"),
                                         ("cold-encoder-sdpa-first-call-no-steps", "`cudaFuncGetAttributes`"),
                                         ("cold-vit-first-inference-no-steps",
                                          "the first `aten::_cudnn_attention_forward`")])
def test_a_window_from_the_first_call_says_so_once(name, calls, own):
    """A profile around a model's first call (no warm-up), no markers: its first launches (each loading its
    module), cudaFuncGetAttributes and the libraries' set-up inside the first operators are one cold start, said
    on a one-off line, and the GPU idle while the host was in them is priced by no finding (the MLP's 179 ms
    window was gpu_waits_on_host 176.9 ms/step, 'cause unknown', before)."""
    s = own(name)
    assert s["window"] == "whole trace"
    cold = [r for r in s["one_off"] if r["kind"] == "cold first pass" and r["step"] is None]
    assert len(cold) == 1 and calls in cold[0]["text"] and "first kernel launches" in cold[0]["text"]
    assert cold[0]["ms"] > 0.5 * s["step_ms"]
    assert sum(f["ms_per_step"] for f in s["findings"]) < s["step_ms"] - cold[0]["ms"]
    assert "one-off, not per step: the window holds the model's first calls, cold" in to_markdown(s)


@pytest.mark.parametrize("name", ["cold-resnet18-first-train-steps", "cold-gpt-first-train-steps",
                                  "cold-resnet18-224-first-train-steps-no-steps", "cold-bert-first-inference-no-steps"])
def test_a_first_step_or_iteration_is_a_cold_first_pass(name, own):
    """A schedule that starts at step 0, or a loop without markers from its first call: the first step is left out
    as a cold first pass (579-1,865 ms against 4-18 ms warm), not priced per step."""
    s = own(name)
    first = [r for r in s["one_off"] if r.get("position") == 1]
    assert first and first[0]["kind"] == "cold first pass" and first[0]["ms"] > 10 * first[0]["median_ms"]


# ---------------------------------------------------------------------------------------------------------
# A device that ran without its events; a GPU left unused

@pytest.mark.parametrize("name, op", [("cpuactivity-cuda-resnet50-train", "`aten::cudnn_convolution`"),
                                      ("cpuactivity-cuda-resnet18-loader", "`aten::cudnn_convolution`"),
                                      ("cpuactivity-cuda-gpt-train-no-steps", "`aten::_cudnn_attention_backward`"),
                                      ("cpuactivity-cuda-vit-inference", "`aten::_scaled_dot_product_")])
def test_a_cuda_model_recorded_with_cpu_activity_only_says_so(name, op, own):
    """activities=[ProfilerActivity.CPU] around a model on the GPU: no kernel events; the operators only a GPU runs
    say it, no CPU rule prices the host's dispatch as CPU compute, and the report asks for CUDA activity."""
    s = own(name)
    assert s["kind"] == "cpu" and not s["findings"]
    assert "this CUDA model's operators ran with CPU activity only" in s["no_findings"] and op in s["no_findings"]
    assert "ProfilerActivity.CUDA" in s["no_findings"]


def test_gpu_only_operators_alone_say_a_device_ran_them():
    """An older capture with CPU activity only records no runtime call and may list no GPU: the cuDNN operator
    alone tells (issue #57: such a trace got the CPU's advice, 'on the CPU, Inductor compiles C++')."""
    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::cudnn_convolution", "ts": 0, "dur": 50},
                             {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "ts": 60, "dur": 5}]}
    assert "`aten::cudnn_convolution`" in device_work.unrecorded(trace)
    trace["traceEvents"][0]["name"] = "aten::mkldnn_convolution"
    assert device_work.unrecorded(trace) is None and device_work.beside_gpu(trace) is None
    trace["deviceProperties"] = [{"name": "Tesla V100-SXM2-16GB"}]
    assert device_work.unrecorded(trace) is None and device_work.beside_gpu(trace) == "Tesla V100-SXM2-16GB"


@pytest.mark.parametrize("name, op", [("modeloncpu-resnet18-train", "`aten::mkldnn_convolution`"),
                                      ("modeloncpu-gpt-train-no-steps", "`aten::mm`")])
def test_a_model_on_the_cpu_beside_a_listed_gpu_is_told_to_move(name, op, own):
    """The model and batch never moved to the H200 the trace lists: device_unused leads, ahead of the CPU's own
    fixes (fusing, threads), with the move as its fix."""
    s = own(name)
    assert s["kind"] == "cpu" and kinds(s) == ["device_unused"]
    top = s["findings"][0]
    assert "NVIDIA H200 is listed" in top["evidence"] and op in top["evidence"]
    assert top["fix"].startswith("a GPU is listed but the model's operators ran on the CPU: move the model")


def test_a_loader_bound_cpu_run_beside_a_gpu_keeps_the_loader_first(own):
    """An MLP's inference on the CPU of the H200 machine, its 0-worker DataLoader 93% of the step: input_bound
    leads, device_unused prices only the model's operators (the Dataset's own stay on the host), and the two fit
    in the step."""
    s = own("modeloncpu-mlp-inference-loader")
    assert kinds(s) == ["input_bound", "device_unused"]
    assert sum(f["ms_per_step"] for f in s["findings"]) <= s["step_ms"] + 1e-3
