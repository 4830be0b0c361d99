"""Issue #42 item 5: bounds and rates that mean something. No over_bound on kernels of a few microseconds (their
fixed cost is their time), attention bounded on its sequence lengths padded to the kernels' tile (ViT-B/16's
T=197), and every quoted reference rate says where it comes from."""
import os

import pytest

from profiling.profile.findings import waste
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import bound, roofline

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


class Fake:
    """The little of a Timeline over_bound reads: one step of `n` kernels of `us` each, bounded at `b`."""

    def __init__(self, n, us, b, cat="other compute"):
        self.per_step = [[({"name": f"k{i % 3}", "dur": us, "ts": i * 100}, {}) for i in range(n)]]
        self.labels, self.bounds = [[cat] * n], [[b] * n]
        self.parent, self.meta, self.n = {}, {}, 1

    def op_of(self, launch):
        return None


def ctx(step_us):
    return {"n": 1, "step": step_us / 1e3, "claimed": set()}


def test_kernels_of_a_few_microseconds_are_not_over_their_bound():
    tiny = Fake(1000, 5.0, 0.1)  # 1,000 kernels of 5 us at 50x a bytes bound: their fixed cost, not waste
    assert waste.over_bound(tiny, ctx(6000), []) is None
    long = Fake(100, 50.0, 1.0)  # the same ratio on kernels of 50 us: far over
    f = waste.over_bound(long, ctx(6000), [])
    assert f and f["ms_per_step"] == pytest.approx(4.9) and "under 10 us not judged" in f["evidence"]


def vit_attention(t):
    return {"name": "aten::_scaled_dot_product_cudnn_attention",
            "args": {"Input Dims": [[64, 12, t, 64]] * 3 + [[]], "Concrete Inputs": ["", "", "", "", "True", "0.",
                                                                                     "False", "False", ""]}}


def test_attention_is_bounded_on_its_padded_tiles():
    assert roofline.tile_padding(vit_attention(197), 128) == pytest.approx((256 / 197) ** 2)
    assert roofline.tile_padding(vit_attention(2048), 128) == 1.0
    assert roofline.tile_padding({"name": "aten::mm"}, 128) == 1.0
    # the kernel under the call: its bound scales with the padding (bound._padding walks up to the call)
    call = vit_attention(197)
    inner = {"name": "aten::fill_"}
    tl = type("T", (), {"parent": {id(inner): call}})()
    assert bound._padding(tl, inner) == pytest.approx(1.69, abs=0.01)


def fp32(name):
    s = summarize(load_trace(os.path.join(DATA, name)))
    return next(f for f in s["findings"] if f["kind"] == "fp32_matmul")


def test_a_reference_rate_says_where_it_comes_from():
    measured = fp32("h100-plant-fp32_mlp.trace.json.gz")
    assert "at this trace's bf16 GEMM rate" in measured["evidence"]
    datasheet = fp32("foreign/hta-a100-80gb-rank0.json.gz")  # its GEMMs are all float32
    assert "this trace's bf16 GEMM rate" not in datasheet["evidence"]
    assert "60% of the device's datasheet bf16 peak (no bf16 GEMM in this trace to measure)" in datasheet["evidence"]


def test_the_bound_rate_says_where_it_comes_from():
    s = summarize(load_trace(os.path.join(DATA, "h100-plant33-cublas_no_workspace.trace.json.gz")))
    over = next(f for f in s["findings"] if f["kind"] == "over_bound")
    assert "bounds: FLOPs at 718 TFLOP/s, the rate of this trace's fastest large bf16 GEMMs" in over["evidence"]
    rate, source = bound.gemm_ceiling(type("T", (), {"per_step": [], "labels": [], "meta": {}})(), [], 989.5e12)
    assert rate == pytest.approx(0.8 * 989.5e12) and "datasheet peak (no large GEMM in this trace" in source
