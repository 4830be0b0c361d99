"""profiling.profile.report.summary (and the kernel names and categories of profiling.profile.trace.classify): on recorded traces and on
small synthetic traces whose numbers are computed by hand."""
import gzip
import json
import os

import pytest

from profiling.errors import UserError
from profiling.profile.report.summary import diff, load_summary, load_trace, summarize
from profiling.profile.trace.classify import classify_kernel, short_name, unique_names

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
H100 = os.path.join(DATA, "h100-compiled-gpt-5steps.trace.json.gz")
CPU = os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")
UNPROFILED_MS = 88.5  # measured in the same process just before the H100 fixture was recorded


@pytest.fixture(scope="module")
def h100():
    return summarize(load_trace(H100))


def check(s, name):
    return next(c for c in s["checks"] if c["name"] == name)


# ---------------------------------------------------------------------------------------------------------
# The H100 fixture: a compiled 8-layer GPT, 2 warm-up + 5 active steps

def test_h100_step_time_matches_unprofiled(h100):
    assert h100["kind"] == "cuda" and h100["steps"] == 5
    assert abs(h100["step_ms"] - UNPROFILED_MS) / UNPROFILED_MS < 0.02
    assert h100["device"] == "NVIDIA H100 80GB HBM3"


def test_h100_equal_kernel_counts_per_step(h100):
    c = check(h100, "device events per step")
    assert c["ok"] and c["detail"] == "490 in each of 5 steps"


def test_h100_parts_add_up_to_the_step(h100):
    assert sum(h100["categories"].values()) == pytest.approx(h100["step_ms"], abs=1e-3)
    assert h100["categories"]["idle"] == h100["idle_ms"]
    assert 0 < h100["idle_ms"] < 0.02 * h100["step_ms"]  # the queue was full: the GPU barely waited


def test_h100_categories_cover_device_time(h100):
    cats = h100["categories"]
    named = sum(cats[c] for c in ("GEMM", "attention", "other compute", "optimizer", "memory"))
    assert named >= 0.99 * h100["device_ms"]
    assert cats["GEMM"] > 25 and cats["attention"] > 15 and cats["other compute"] > 20
    assert 0 < cats["optimizer"] < 1 and 0 < cats["memory"] < 1
    assert h100["other_kernels"] == [k["name"] for k in h100["kernels"] if k["category"] == "other"]
    assert check(h100, "categories cover device time")["ok"]


def test_h100_warmup_kernels_not_counted(h100):
    assert h100["not_counted"]["launched_before_steps"] == 792
    assert all(c["ok"] for c in h100["checks"])
    # Summing every kernel in the window would give ~117 ms/step (DESIGN.md, pitfall 2).
    assert h100["device_ms"] < 90


def test_h100_kernel_table(h100):
    kernels = h100["kernels"]
    assert len(kernels) == h100["kernels_total"] == 45
    ms = [k["ms_per_step"] for k in kernels]
    assert ms == sorted(ms, reverse=True)
    assert len({k["name"] for k in kernels}) == len(kernels)
    top = kernels[0]
    assert top["name"] == "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT" and top["category"] == "GEMM"
    assert top["calls_per_step"] == 49 and top["pct_of_step"] == pytest.approx(
        100 * top["ms_per_step"] / h100["step_ms"], abs=1e-3)
    adam = next(k for k in kernels if "FusedAdam" in k["raw_name"])
    assert adam["category"] == "optimizer" and adam["name"] == "multi_tensor_apply_kernel[FusedAdamMathFunctor]"
    total = sum(k["ms_per_step"] for k in kernels)
    assert total == pytest.approx(h100["device_ms"], abs=0.01)


def test_h100_top_keeps_only_the_first_rows():
    s = summarize(load_trace(H100), top=3)
    assert len(s["kernels"]) == 3 and s["kernels_total"] == 45


def test_h100_summary_is_plain_json_data(h100):
    assert json.loads(json.dumps(h100)) == h100
    for key in ("steps", "step_ms", "idle_ms", "categories", "kernels", "checks", "device", "torch",
                "tokens_per_step", "mfu_percent", "peak_memory_mb", "kind", "regions"):
        assert key in h100


# ---------------------------------------------------------------------------------------------------------
# Metadata written by the capture

def with_meta(trace, **meta):
    trace = dict(trace)
    trace["autoresearch"] = meta
    return trace


@pytest.mark.parametrize("unprofiled, explained", [(67.53, True), (40.0, False), (100.0, False)])
def test_cpu_step_time_excess_within_the_profilers_cost_per_operator(unprofiled, explained):
    # cpu-gpt-2steps: 85.40 ms profiled, 4,671 operators/step: up to 4,671 x 8 us = 37.4 ms is the profiler's
    s = summarize(load_trace(os.path.join(DATA, "cpu-gpt-2steps.trace.json.gz")), unprofiled_ms=unprofiled)
    c = check(s, "profiled vs unprofiled step time")
    assert not c["ok"] and ("explained" in c) == explained
    if explained:
        assert c["explained"].startswith("4,671 operators/step x 3.8 us = the 17.87 ms excess, within the CPU "
                                         "profiler's fixed cost per operator (~8 us measured)")


def test_samples_per_second_beside_tokens():
    s = summarize(with_meta(load_trace(CPU), samples_per_step=256))
    assert s["samples_per_step"] == 256 and s["tokens_per_second"] is None
    assert s["samples_per_s"] == pytest.approx(256 / (s["step_ms"] / 1e3), rel=1e-3)


def test_metadata_header_and_step_time_check():
    trace = load_trace(H100)
    s = summarize(with_meta(trace, unprofiled_step_ms=88.5, tokens_per_step=131072, torch="2.11.0",
                            commit="abc1234", peak_memory_mb=45060.2, flops_per_step=4e13, peak_flops=989.5e12))
    assert (s["torch"], s["commit"], s["tokens_per_step"], s["peak_memory_mb"]) == \
        ("2.11.0", "abc1234", 131072, 45060.2)
    assert s["mfu_percent"] == pytest.approx(100 * 4e13 / (s["step_ms"] / 1e3) / 989.5e12, abs=1e-3)
    assert s["tokens_per_second"] == pytest.approx(131072 / (s["step_ms"] / 1e3), rel=1e-6)
    assert check(s, "profiled vs unprofiled step time")["ok"]
    assert s["samples_per_step"] is None and s["samples_per_s"] is None  # not given: not made up
    slow = summarize(with_meta(trace, unprofiled_step_ms=80.0, mfu_percent=40.0))
    c = check(slow, "profiled vs unprofiled step time")
    assert not c["ok"] and "+10.6%" in c["detail"]
    assert slow["mfu_percent"] == 40.0


def test_step_time_not_measured_is_ok(h100):
    c = check(h100, "profiled vs unprofiled step time")
    assert c["ok"] and c["detail"].startswith("not measured")


# ---------------------------------------------------------------------------------------------------------
# Synthetic traces (times in microseconds, as in a Chrome trace)

def make_trace(steps, kernels, launches_only=(), extra=()):
    """steps: [(start, end)]; kernels: [(name, launch_ts or None, start, dur)]; each gets its own correlation
    (in order, from 100); a None launch means no launch event. launches_only: launch times with no kernel."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
               "ts": a, "dur": b - a} for i, (a, b) in enumerate(steps)]
    for corr, (name, launch, start, dur) in enumerate(kernels, 100):
        if launch is not None:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": launch, "dur": 1.0, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                       "args": {"correlation": corr, "stream": 7}})
    for corr, launch in enumerate(launches_only, 900):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch, "dur": 1.0, "args": {"correlation": corr}})
    return {"traceEvents": events + list(extra)}


# Two steps: CPU windows [0, 60000] and [60000, 90000]; GPU kernels (single stream):
#   step 0: 50000-60000, 70000-80000   step 1: 100000-120000, 130000-140000
# step 0 runs from its first kernel to step 1's first kernel: 50 ms, busy 20, idle 30;
# step 1 (the last) runs to max(its last kernel end, start + CPU window) = max(140000, 130000): 40 ms,
# busy 30, idle 10. Means: step 45 ms, idle 20 ms, device 25 ms.
STEPS = [(0, 60000), (60000, 90000)]
KERNELS = [("gemm_a", 10000, 50000, 10000), ("triton_poi_fused_add_0", 20000, 70000, 10000),
           ("gemm_a", 65000, 100000, 20000), ("triton_poi_fused_add_0", 70000, 130000, 10000)]


def test_idle_gaps_hand_computed():
    s = summarize(make_trace(STEPS, KERNELS))
    assert s["step_ms_each"] == [50.0, 40.0]
    assert s["step_ms"] == 45.0 and s["idle_ms"] == 20.0 and s["device_ms"] == 25.0
    assert s["categories"]["GEMM"] == 15.0 and s["categories"]["other compute"] == 10.0
    assert s["categories"]["overlap"] == 0.0
    assert sum(s["categories"].values()) == 45.0
    assert [(k["name"], k["ms_per_step"], k["calls_per_step"]) for k in s["kernels"]] == \
        [("gemm_a", 15.0, 1.0), ("triton_poi_fused_add_0", 10.0, 1.0)]
    assert all(c["ok"] for c in s["checks"])


def test_warmup_kernels_inside_the_active_window_are_not_counted():
    warm = [("warmup_no_launch", None, 82000, 13000),        # launched in warm-up: no launch recorded
            ("warmup_launched_early", -5000, 81000, 500)]     # launch recorded, but before every step
    kernels = warm[:1] + KERNELS + warm[1:]  # the first gets the lowest correlation, as in a real trace
    s = summarize(make_trace(STEPS, kernels))
    assert s["step_ms"] == 45.0 and s["idle_ms"] == 20.0 and s["device_ms"] == 25.0
    assert {k["name"] for k in s["kernels"]} == {"gemm_a", "triton_poi_fused_add_0"}
    assert s["not_counted"] == {"launched_before_steps": 1, "launched_outside_steps": 1, "bogus_timestamps": 0}
    assert all(c["ok"] for c in s["checks"])


def test_dropped_events_are_flagged():
    kernels = KERNELS[:2] + [("lost_launch", None, 85000, 1000)] + KERNELS[2:]  # correlation inside the range
    s = summarize(make_trace(STEPS, kernels, launches_only=[30000]))
    c = check(s, "device events without a launch")
    assert not c["ok"] and "lost_launch" in c["detail"]
    c = check(s, "launches without a device event")
    assert not c["ok"] and c["detail"].startswith("1 device records dropped")
    assert s["device_ms"] == 25.0  # nothing invented, nothing double counted


@pytest.mark.parametrize("start, dur, reason", [
    (0, 5000, "zero timestamp"),
    (85000, -10.0, "end before start"),
    (15000, 100, "starts before its launch"),
    (9e12, 100, "starts outside the trace span"),
    (85000, 1e12, "longer than the whole trace"),
])
def test_bogus_timestamps_are_flagged_and_ignored(start, dur, reason):
    kernels = KERNELS[:2] + [("garbage", 30000, start, dur)] + KERNELS[2:]
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
            "ts": -1000, "dur": 200000}
    s = summarize(make_trace(STEPS, kernels, extra=[span]))
    c = check(s, "bogus timestamps")
    assert not c["ok"] and reason in c["detail"] and "garbage" in c["detail"]
    assert s["device_ms"] == 25.0 and s["not_counted"]["bogus_timestamps"] == 1


def test_unequal_kernel_counts_fail():
    kernels = KERNELS + [("gemm_a", 75000, 141000, 1000)]
    c = check(summarize(make_trace(STEPS, kernels)), "device events per step")
    assert not c["ok"] and c["detail"] == "differ across steps: 2, 3"


def test_optimizer_window_and_uncategorised_kernels():
    kernels = KERNELS + [("my_custom_kernel", 85000, 141000, 9000)]
    optimizer = {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#Muon.step", "pid": 1, "tid": 1,
                 "ts": 69000, "dur": 2000}  # holds the launch of step 1's second kernel
    s = summarize(make_trace(STEPS, kernels, extra=[optimizer]))
    assert s["categories"]["optimizer"] == 5.0 and s["categories"]["other"] == 4.5
    assert s["other_kernels"] == ["my_custom_kernel"]
    c = check(s, "categories cover device time")
    assert not c["ok"] and "my_custom_kernel" in c["detail"]


def test_concurrent_kernels_keep_the_parts_adding_up():
    kernels = KERNELS + [("gemm_b", 66000, 105000, 10000)]  # runs beside step 1's first kernel
    s = summarize(make_trace(STEPS, kernels))
    assert s["categories"]["overlap"] == -5.0
    assert sum(s["categories"].values()) == pytest.approx(s["step_ms"])


# ---------------------------------------------------------------------------------------------------------
# CPU profile

def test_cpu_trace_is_a_cpu_profile():
    s = summarize(load_trace(CPU))
    # its second step took 51.6 ms against 18.1 and 15.2: a one-off, left out (irregular.split)
    assert s["kind"] == "cpu" and s["steps"] == 2 and s["device_ms"] is None
    assert [r["position"] for r in s["one_off"]] == [2]
    assert sum(s["categories"].values()) == pytest.approx(s["step_ms"], abs=1e-3)
    names = {k["name"]: k for k in s["kernels"]}
    assert names["aten::mm"]["category"] == "GEMM" and names["aten::addmm"]["category"] == "GEMM"
    assert s["categories"]["GEMM"] > 0 and s["categories"]["optimizer"] > 0
    assert check(s, "CPU ops per step")["ok"]


def test_cpu_self_time_excludes_children():
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 10000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 1000, "dur": 5000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 2000, "dur": 3000},
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 7000, "dur": 1000},
    ]
    s = summarize({"traceEvents": events})
    rows = {k["name"]: k["ms_per_step"] for k in s["kernels"]}
    assert rows == {"aten::addmm": 3.0, "aten::linear": 2.0, "aten::relu": 1.0}
    assert s["categories"]["outside ops"] == 4.0 and s["step_ms"] == 10.0


# ---------------------------------------------------------------------------------------------------------
# Bad input: one line, UserError

def write(tmp_path, name, data, compress=False):
    path = tmp_path / name
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return str(path)


@pytest.mark.parametrize("data, message", [
    (b"this is not json", "not JSON"),
    ({"hello": 1}, "not a torch.profiler trace"),
    ([1, 2, 3], "not a torch.profiler trace"),
    ({"traceEvents": []}, "no device events and no CPU operators"),
    ({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 1, "dur": 1}]},
     "no device events and no CPU operators"),
])
@pytest.mark.parametrize("compress", [False, True])
def test_bad_input_is_one_line(tmp_path, data, message, compress):
    path = write(tmp_path, "bad.json.gz" if compress else "bad.json", data, compress)
    with pytest.raises(UserError) as e:
        load_trace(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_file_and_device_events_without_launches(tmp_path):
    with pytest.raises(UserError, match="cannot read"):
        load_trace(str(tmp_path / "nope.json"))
    trace = make_trace(STEPS, [("k", None, 50000, 10)])
    with pytest.raises(UserError, match="no CUDA runtime/driver launch events"):
        summarize(trace)
    with pytest.raises(UserError, match="no CUDA runtime/driver launch events"):  # no markers, nothing on the host
        summarize({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}]})


def test_load_summary_reads_a_summary_or_a_trace(tmp_path):
    s = summarize(make_trace(STEPS, KERNELS))
    assert load_summary(write(tmp_path, "s.json", s)) == s
    assert load_summary(write(tmp_path, "t.json", make_trace(STEPS, KERNELS))) == s


# ---------------------------------------------------------------------------------------------------------
# diff

def test_diff_reports_what_moved():
    before = summarize(with_meta(make_trace(STEPS, KERNELS), commit="aaa"))
    faster = [(n, launch, start, dur / 2 if n == "gemm_a" else dur) for n, launch, start, dur in KERNELS]
    after = summarize(with_meta(make_trace(STEPS, faster), commit="bbb"))
    d = diff(before, after)
    assert (d["previous_commit"], d["current_commit"]) == ("aaa", "bbb")
    assert d["kernels"][0]["name"] == "gemm_a" and d["kernels"][0]["change_ms"] == -7.5
    assert d["categories"][0]["name"] in ("GEMM", "idle") and abs(d["categories"][0]["change_ms"]) == 7.5
    assert d["step_ms"]["previous"] == 45.0 and d["notes"] == []
    assert json.loads(json.dumps(d)) == d


# ---------------------------------------------------------------------------------------------------------
# Names and categories

def test_short_names():
    assert short_name("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert short_name("triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_threshold_backward_view_4") == \
        "triton_poi_fused_mul_pow_relu_threshold_backward_4"
    assert short_name("triton_poi_fused__to_copy_t_1") == "triton_poi_fused_to_copy_t_1"
    assert short_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                      "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)") \
        == "vectorized_elementwise_kernel[CUDAFunctor_add]"
    assert short_name("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
                      "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)") == \
        "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8"
    assert short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert len(short_name("triton_red_fused_" + "_".join(["mul", "add", "tanh"] * 20) + "_3")) <= 72


def test_different_raw_names_never_share_a_name():
    raws = ["void at::native::vectorized_elementwise_kernel<4, Foo<float> >(int)",
            "void at::native::vectorized_elementwise_kernel<2, Foo<float> >(int)",
            "vectorized_elementwise_kernel #2", "vectorized_elementwise_kernel"]
    names = unique_names(raws)
    assert len(set(names.values())) == len(raws)
    assert names[raws[0]] == "vectorized_elementwise_kernel #1"


@pytest.mark.parametrize("raw, cat, expected", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "kernel", "GEMM"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(cublasLt::cublasSplitKParams<float>)", "kernel", "GEMM"),
    ("triton_tem_fused_addmm_relu_0", "kernel", "GEMM"),
    ("triton_tem_fused_flex_attention_backward_transpose_view_12", "kernel", "attention"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdSm90<cutlass::bfloat16_t> >(Params)", "kernel", "attention"),
    # cuDNN SDPA (train.py's plain causal layers): the fused kernel and its backward helpers
    ("cudnn_generated_fort_native_sdpa_flash_bprop_wgmma_f16_knob_26_64x64x128", "kernel", "attention"),
    ("void compute_dot_do_o_specialized<128, 128>(int, int, int, __nv_bfloat16 const*)", "kernel", "attention"),
    ("void convert_dq_to_16bits<128, 128>(int, int, int, float const*, __nv_bfloat16*)", "kernel", "attention"),
    ("triton_per_fused__fused_rms_norm__to_copy__unsafe_view_add_9", "kernel", "other compute"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, {lambda(float, float)#1}> >()",
     "kernel", "other compute"),
    ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float> >()", "kernel", "optimizer"),
    ("Memset (Device)", "gpu_memset", "memory"),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memory"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "communication"),
    ("my_custom_kernel", "kernel", "other"),
])
def test_categories(raw, cat, expected):
    assert classify_kernel(raw, cat) == expected
