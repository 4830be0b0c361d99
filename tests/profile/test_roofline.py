"""The roofline columns (profiling/profile/tables/roofline.py) and the head's backward, on a real default-config H100 trace."""
import math
from pathlib import Path

import pytest

from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import summarize
from profiling.profile.tables import roofline
from profiling.profile.tables.regions import path_region
from profiling.profile.trace.traceio import load_trace

DATA = Path(__file__).parent.parent / "data"
DEFAULT = DATA / "h100-cudnn-window-gpt-5steps.trace.json.gz"   # default config, H100, record_shapes=True
PEAK = 989.5e12


@pytest.fixture(scope="module")
def default():
    trace = load_trace(DEFAULT)
    return trace["autoresearch"], summarize(trace)


def rows(s):
    return {r["region"]: r for r in s["regions"]["rows"]}


def params_in(meta, region):
    return sum(math.prod(shape) for name, shape in meta["parameters"].items() if path_region(name) == region)


def test_every_region_row_has_flops_and_percent_of_peak(default):
    _, s = default
    for region, r in rows(s).items():
        if region in ("GPU idle", "overlap"):
            assert r["flops"] is None
            continue
        assert r["flops"] is not None and r["percent_of_peak"] is not None, region
    assert rows(s)["attention"]["flops"] > 0 and rows(s)["head and loss"]["flops"] > 0
    assert rows(s)["norms and residuals"]["flops"] == 0  # elementwise: bytes, not FLOPs
    assert rows(s)["norms and residuals"]["gb_per_s"] > 500


def test_mlp_flops_are_six_times_tokens_times_its_parameters(default):
    meta, s = default
    mlp = rows(s)["MLP"]
    expected = 6 * meta["tokens_per_step"] * params_in(meta, "MLP")
    assert expected == pytest.approx(5.28e13, rel=0.01)
    assert mlp["flops"] == pytest.approx(expected, rel=1e-6)
    assert mlp["tflops_per_s"] * 1e12 == pytest.approx(expected / (mlp["ms_per_step"] / 1e3), rel=0.10)
    assert mlp["percent_of_peak"] == pytest.approx(100 * mlp["tflops_per_s"] * 1e12 / PEAK, abs=0.1)


def test_head_backward_holds_its_two_gradient_gemms(default):
    _, s = default
    head = rows(s)["head and loss"]
    two_gemms_at_peak = 2 * 2 * 262144 * 8192 * 512 * 2 / PEAK * 1e3  # dX and dW, 2 micro-batches
    assert two_gemms_at_peak == pytest.approx(8.9, abs=0.05)
    assert head["backward_ms"] >= two_gemms_at_peak
    assert s["regions"]["moved_to_backward_ms"] == pytest.approx(11.29, abs=0.05)
    assert head["forward_ms"] + head["backward_ms"] == pytest.approx(head["ms_per_step"], abs=1e-3)


@pytest.mark.parametrize("region", ["attention", "MLP"])
def test_backward_is_one_and_a_half_to_three_times_forward(default, region):
    r = rows(default[1])[region]
    assert 1.3 <= r["backward_ms"] / r["forward_ms"] <= 3.5


def test_kernel_rates(default):
    _, s = default
    by_name = {k["name"]: k for k in s["kernels"]}
    gemm = next(k for k in s["kernels"] if k["category"] == "GEMM")
    assert 0.4 * PEAK < gemm["tflops_per_s"] * 1e12 < PEAK
    relu = by_name["triton_poi_fused_pow_relu_7"]
    assert relu["flops"] is None and 1000 < relu["gb_per_s"] < 3350  # under the H100's 3.35 TB/s
    assert relu["percent_of_bandwidth"] == pytest.approx(100 * relu["gb_per_s"] / 3350, abs=0.1)
    attention = [k for k in s["kernels"] if k["category"] == "attention"]
    assert all(k["tflops_per_s"] for k in attention)
    md = to_markdown(s)
    assert "over the region's whole time" in md and "recorded no input shapes" not in md
    assert f"| {relu['gb_per_s']:,.0f} GB/s ({relu['percent_of_bandwidth']:.0f}%)" in md


def test_attention_flops_count_the_mask():
    q = [8, 4, 2048, 128]
    causal = 4.0 * 8 * 4 * 128 * 2048 * 2049 / 2
    sdpa = {"name": "aten::_scaled_dot_product_cudnn_attention",
            "args": {"Input Dims": [q, q, q, [], [], [], [], [], []],
                     "Concrete Inputs": ["", "", "", "", "True", "0.", "True", "False", ""]}}
    assert roofline.attention_flops(sdpa) == causal
    sdpa["args"]["Concrete Inputs"][6] = "False"
    assert roofline.attention_flops(sdpa) == 4.0 * 8 * 4 * 128 * 2048 * 2048
    assert roofline.attention_flops(sdpa, force=True) == causal  # a mask counted as causal, whatever the flag
    del sdpa["args"]["Concrete Inputs"]  # the flag not recorded: the model's kind decides (attention_kind)
    assert roofline.attention_flops(sdpa, causal=True) == causal
    assert roofline.attention_flops(sdpa, causal=False) == 4.0 * 8 * 4 * 128 * 2048 * 2048
    window = {"name": "autoresearch::window_attention", "args": {"Input Dims": [q, q, q, []],
                                                                 "Concrete Inputs": ["", "", "", "1024"]}}
    pairs = sum(min(i, 1024) + 1 for i in range(2048))
    assert roofline.attention_flops(window) == 4.0 * 8 * 4 * 128 * pairs
    backward = {"name": "autoresearch::window_attention_backward",
                "args": {"Input Dims": [q, q, q, q, q, [8, 4, 2048, 1], []],
                         "Concrete Inputs": ["", "", "", "", "", "", "1024"]}}
    assert roofline.attention_flops(backward) == 2.5 * roofline.attention_flops(window)
    assert roofline.attention_flops({"name": "aten::_scaled_dot_product_cudnn_attention", "args": {}}) is None


@pytest.mark.parametrize("tq,tk,window", [(7, 7, None), (7, 7, 3), (3, 9, None), (3, 9, 4), (9, 9, 0), (5, 5, 99)])
def test_pairs_closed_form(tq, tk, window):
    w = tk if window is None else window
    brute = sum(1 for i in range(tq) for j in range(tk) if 0 <= i + tk - tq - j <= w)
    assert roofline._pairs(tq, tk, True, window) == brute


def test_triton_bytes_and_gemm_flops():
    triton = {"name": "triton_poi_fused_pow_relu_7",
              "args": {"kernel_backend": "triton", "Input Dims": [[262144, 2048], [128, 2048, 2048], []],
                       "Input type": ["c10::BFloat16", "c10::BFloat16", "Scalar"]}}
    assert roofline.tensor_bytes(triton) == 2 * 2 * 262144 * 2048
    assert roofline.tensor_bytes({"name": "aten::add", "args": triton["args"] | {"kernel_backend": None}}) is None
    mm = {"name": "aten::mm", "args": {"Input Dims": [[262144, 512], [512, 8192]]}}
    assert roofline.gemm_flops(mm) == 2.0 * 262144 * 512 * 8192
    assert roofline.gemm_flops({"name": "aten::mm", "args": {"Input Dims": [[4, 5], [6, 7]]}}) is None


def test_rates_without_a_known_peak():
    r = roofline.rates(1e12, 1e6, 2e9, 1e6)
    assert r == {"flops": 1e12, "tflops_per_s": 1.0, "percent_of_peak": None, "bytes": 2e9, "gb_per_s": 2.0,
                 "percent_of_bandwidth": None}


def test_nothing_moves_where_the_backward_runs_in_the_backward_graph():
    """The unfused loss (h200-default: F.cross_entropy) keeps the head's gradient GEMMs in the compiled
    backward: the rule finds nothing to move, and the head's backward is measured where it runs."""
    s = summarize(load_trace(DATA / "h200-default-gpt-5steps.trace.json.gz"))
    assert s["regions"]["moved_to_backward_ms"] == 0.0
    head = rows(s)["head and loss"]
    assert head["backward_ms"] > 2 * 2 * 262144 * 8192 * 512 * 2 / PEAK * 1e3
