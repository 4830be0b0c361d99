"""Issue #42 item 5: bounds and rates that mean something. No over_bound on kernels of a few microseconds (their
fixed cost is their time), attention bounded on its sequence lengths padded to the kernels' tile (ViT-B/16's
T=197), and every quoted reference rate says where it comes from."""
import os

import pytest

from profiling.profile.findings import over
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import bound, roofline

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


class Fake:
    """The little of a Timeline over_bound reads: one step of `n` kernels of `us` each, bounded at `b`, each a grid
    of `blocks` on a device of `sms` SMs."""

    def __init__(self, n, us, b, cat="other compute", blocks=None, sms=None):
        args = {"grid": [blocks, 1, 1], "block": [128, 1, 1]} if blocks else {}
        self.per_step = [[({"name": f"k{i % 3}", "dur": us, "ts": i * 100, "args": args}, {}) for i in range(n)]]
        self.labels, self.bounds = [[cat] * n], [[b] * n]
        self.parent, self.meta, self.n = {}, {"sms": sms}, 1

    def op_of(self, launch):
        return None


def ctx(step_us):
    return {"n": 1, "step": step_us / 1e3, "claimed": set()}


def test_kernels_of_a_few_microseconds_are_not_over_their_bound():
    tiny = Fake(1000, 5.0, 0.1)  # 1,000 kernels of 5 us at 50x a bytes bound: their fixed cost, not waste
    assert over.over_bound(tiny, ctx(6000), []) is None
    long = Fake(100, 50.0, 1.0)  # the same ratio on kernels of 50 us: far over
    f = over.over_bound(long, ctx(6000), [])
    assert f and f["ms_per_step"] == pytest.approx(4.9) and "kernels under 10 us, whose work needs under 1 us" in f["evidence"]
    small = Fake(100, 50.0, 0.02)  # 50 us for work of 0.02 us (a 513-element copy on an MI300X): its fixed cost
    assert over.over_bound(small, ctx(6000), []) is None


def test_one_partial_wave_of_a_small_shape_is_not_over_its_bound():
    """ViT-B/16 at batch 4 on the H100 (tests/data/foreign/tracelens-h100-vit-nsfw-inference): flash attention in 96
    blocks and GEMMs in 98 on 132 SMs, their work 1-5 us: the shape leaves SMs idle, no slow form (over_bound led
    with 0.44 ms before issue #48). A grid far under the SMs for much more work is the kernel's choice (cuBLAS
    without its workspace, no split-K) and is judged."""
    wave = Fake(100, 60.0, 4.0, blocks=98, sms=132)
    assert over.over_bound(wave, ctx(6000), []) is None
    assert over.over_bound(Fake(100, 60.0, 4.0, blocks=400, sms=132), ctx(6000), [])  # the grid fills the GPU
    assert over.over_bound(Fake(100, 60.0, 4.0, blocks=8, sms=132), ctx(6000), [])  # far under: the kernel's choice
    s = summarize(load_trace(os.path.join(DATA, "foreign", "tracelens-h100-vit-nsfw-inference.json.gz")))
    assert not [f for f in s["findings"] if f["kind"] == "over_bound"]


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
