"""profiling.profile.tables.regions: where the step goes in the model (the region table), on recorded traces (H200 default
config with parameter shapes, H100 without, our GPT on the CPU), variants of them with rewritten shapes (a
3x MLP, a 1x MLP, a new layer type, unknown shapes, a tied head), and a synthetic trace computed by hand."""
import bisect
import copy
import json
import os

import pytest

from profiling.profile.report.render import to_json, to_markdown
from profiling.profile.report.summary import diff, load_trace, summarize
from profiling.profile.tables import regions
from profiling.profile.trace.traceio import attribute, backward_windows, by_thread, index

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
H200 = os.path.join(DATA, "h200-default-gpt-5steps.trace.json.gz")
H100 = os.path.join(DATA, "h100-compiled-gpt-5steps.trace.json.gz")
CPU_GPT = os.path.join(DATA, "cpu-gpt-2steps.trace.json.gz")
CPU_MLP = os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")
MODEL = ["embedding", "attention", "MLP", "norms and residuals", "head and loss"]
ORDER = MODEL + ["optimizer", "data movement", "unattributed"]


@pytest.fixture(scope="module")
def h200_trace():
    return load_trace(H200)


@pytest.fixture(scope="module")
def h200(h200_trace):
    return summarize(h200_trace)


def rows(s):
    return {r["region"]: r for r in s["regions"]["rows"]}


def ms(s, region):
    return rows(s)[region]["ms_per_step"]


def assert_adds_up(s):
    """Rows sum to the step; the non-model rows equal the step budget's own parts."""
    table = s["regions"]
    assert [r["region"] for r in table["rows"]][:len(ORDER)] == ORDER
    assert sum(r["ms_per_step"] for r in table["rows"]) == pytest.approx(s["step_ms"], abs=2e-3)
    for r in table["rows"]:
        assert r["pct_of_step"] == pytest.approx(100 * r["ms_per_step"] / s["step_ms"], abs=1e-3)
        if r["forward_ms"] is not None:
            assert r["forward_ms"] + r["backward_ms"] == pytest.approx(r["ms_per_step"], abs=2e-4)
    cats = s["categories"]
    assert ms(s, "optimizer") == pytest.approx(cats["optimizer"], abs=2e-4)
    assert ms(s, "data movement") == pytest.approx(cats["memory"], abs=2e-4)
    gap = "GPU idle" if s["kind"] == "cuda" else "outside ops"
    assert ms(s, gap) == pytest.approx(cats["idle" if s["kind"] == "cuda" else "outside ops"], abs=2e-4)
    assert ms(s, "overlap") == pytest.approx(cats["overlap"], abs=2e-4)


# ---------------------------------------------------------------------------------------------------------
# Rules

@pytest.mark.parametrize("name, region", [
    ("blocks.0.attn.c_q.weight", "attention"), ("blocks.7.attn.c_proj.weight", "attention"),
    ("blocks.1.attn.ve_gate.weight", "attention"), ("blocks.0.mlp.c_fc.weight", "MLP"),
    ("blocks.0.mlp.c_proj.weight", "MLP"), ("lm_head.weight", "head and loss"), ("wte.weight", "embedding"),
    ("value_embeds.1.weight", "embedding"), ("resid_lambdas", "norms and residuals"),
    ("x0_lambdas", "norms and residuals"),
    # other codebases' names
    ("transformer.h.0.attn.c_attn.weight", "attention"), ("transformer.h.0.ln_1.weight", "norms and residuals"),
    ("transformer.wpe.weight", "embedding"), ("model.layers.0.self_attn.o_proj.weight", "attention"),
    ("model.layers.0.mlp.gate_proj.weight", "MLP"), ("model.embed_tokens.weight", "embedding"),
    ("model.layers.0.input_layernorm.weight", "norms and residuals"), ("blocks.0.attn.q_norm.weight",
                                                                       "norms and residuals"),
    ("blocks.0.ffn.w1.weight", "MLP"), ("unembed.weight", "head and loss"),
    # Meta's Llama (examples/llama_train.py): a compound's last word says what it is; `output` is the head
    ("tok_embeddings.weight", "embedding"), ("layers.3.attention.wk.weight", "attention"),
    ("layers.3.attention_norm.weight", "norms and residuals"), ("layers.3.ffn_norm.weight", "norms and residuals"),
    ("layers.3.feed_forward.w1.weight", "MLP"), ("layers.3.feed_forward.w2.weight", "MLP"),
    ("norm.weight", "norms and residuals"), ("output.weight", "head and loss"),
    ("model.layers.0.post_attention_layernorm.weight", "norms and residuals"),
    ("output_layer.weight", "head and loss"),
    # `output` inside a block, or holding a submodule, is not the model's head (BERT's output.dense: its MLP)
    ("encoder.layer.3.output.dense.weight", "MLP"), ("layers.3.output.weight", None),
    ("encoder.layer.3.attention.output.dense.weight", "attention"),
    ("bert.encoder.layer.0.intermediate.dense.weight", "MLP"), ("bert.pooler.dense.weight", "head and loss"),
    # conv nets (torchvision's ResNet): convolutions, batch norms, the top-level fc is the classifier
    ("layer1.0.conv1.weight", "convolution"), ("layer1.0.bn2.weight", "norms and residuals"),
    ("fc.weight", "head and loss"), ("blocks.0.mlp.fc1.weight", "MLP"), ("blocks.0.conv.weight", "convolution"),
    # a new layer type names no region
    ("blocks.0.mixer.w_in.weight", None), ("layer1.0.downsample.0.weight", None),
])
def test_parameter_path_to_region(name, region):
    assert regions.path_region(name) == region


@pytest.mark.parametrize("name, region", [
    ("triton_tem_fused__fused_rms_norm__unsafe_view_add_flex_attention_mul_sigmoid_transpose_unsqueeze_view_14",
     "attention"),
    ("triton_tem_fused_flex_attention_backward_transpose_view_16", "attention"),
    ("triton_per_fused__fused_rms_norm_add_embedding_mul_select_0", "embedding"),
    ("triton_poi_fused__unsafe_view_embedding_dense_backward_mul_nll_loss_forward_sigmoid_transpose_view_10",
     "embedding"),
    ("triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_threshold_backward_view_4", "MLP"),
    ("triton_poi_fused__to_copy__unsafe_view_pow_relu_6", "MLP"),
    ("triton_red_fused__log_softmax__to_copy__unsafe_view_div_mul_prepare_softmax_online_tanh_view_1",
     "head and loss"),
    ("triton_red_fused__log_softmax__log_softmax_backward_data_nll_loss_backward_tanh_backward_0",
     "head and loss"),
    ("triton_per_fused__fused_rms_norm__unsafe_view_add_10", "norms and residuals"),
    ("triton_poi_fused_gelu_1", "MLP"), ("aten::_softmax", "attention"), ("aten::_log_softmax", "head and loss"),
    ("autograd::engine::evaluate_function: ReluBackward0", "MLP"), ("aten::native_layer_norm", "norms and residuals"),
    ("aten::embedding_dense_backward", "embedding"), ("aten::_scaled_dot_product_flash_attention", "attention"),
    ("NativeLayerNormBackward0", "norms and residuals"),
    # no region by name: weight casts, plain arithmetic, GEMMs (placed by shapes or other rules)
    ("triton_poi_fused__to_copy_t_1", None), ("triton_poi_fused_add_mul_3", None), ("aten::addmm", None),
    ("aten::normal_", None),
])
def test_names_to_region(name, region):
    text = regions.triton_ops(name) or name
    assert regions.name_region(regions.normalize(text)) == region


def test_gemm_shapes_find_the_weight_forward_and_backward():
    params = regions.Parameters({"blocks.0.attn.c_q.weight": [512, 512], "blocks.0.mlp.c_fc.weight": [2048, 512],
                                 "blocks.0.mlp.c_proj.weight": [512, 2048], "lm_head.weight": [8192, 512],
                                 "wte.weight": [8192, 512]})
    placer = regions.Placer(params)

    def place(dims):
        return placer.place("nvjet_gemm", "GEMM", {"name": "aten::mm", "args": {"Input Dims": dims}})[0]

    assert place([[262144, 512], [512, 512]]) == (("attention", 1.0),)                # forward: x @ W.T
    assert place([[262144, 2048], [2048, 512]]) == (("MLP", 1.0),)                    # input gradient: dy @ W
    assert place([[2048, 262144], [262144, 512]]) == (("MLP", 1.0),)                  # weight gradient: dy.T @ x
    assert place([[262144, 512], [512, 8192], [262144, 8192]]) == (("head and loss", 1.0),)  # not the wte table
    shares, reason, _ = placer.place("nvjet_gemm", "GEMM", {"name": "aten::mm",
                                                            "args": {"Input Dims": [[262144, 512], [512, 1536]]}})
    assert shares == (("unattributed", 1.0),) and reason == "GEMM: no parameter has its shapes [262144, 512] x " \
                                                              "[512, 1536] x [262144, 1536]"
    assert placer.place("nvjet_gemm", "GEMM", {"name": "aten::mm"})[1] == \
        "GEMM: no input shapes recorded (record_shapes=False)"


def test_tied_head_and_shared_shapes():
    tied = regions.Placer(regions.Parameters({"wte.weight": [8192, 512], "blocks.0.attn.c_q.weight": [512, 512]}))
    op = {"name": "aten::mm", "args": {"Input Dims": [[262144, 512], [512, 8192]]}}
    assert tied.place("nvjet", "GEMM", op)[0] == (("head and loss", 1.0),)  # a product with the embedding table
    shared = regions.Placer(regions.Parameters({f"blocks.0.attn.c_{x}.weight": [512, 512] for x in "qkv"} | {
        "blocks.0.mlp.c_fc.weight": [512, 512], "blocks.0.mixer.w.weight": [512, 512]}))
    op = {"name": "aten::mm", "args": {"Input Dims": [[4096, 512], [512, 512]]}}
    shares, reason, record = shared.place("nvjet", "GEMM", op)
    assert shares == (("attention", 0.6), ("MLP", 0.2), ("unattributed", 0.2))
    assert reason == "parameter of no known region: blocks.0.mixer.w.weight"
    assert record == ((512, 512), (("attention", 3), ("MLP", 1), ("unattributed", 1)))


# ---------------------------------------------------------------------------------------------------------
# The H200 fixture: our train.py at the default config, with parameter shapes

def test_h200_regions_add_up_and_reach_the_target(h200):
    assert_adds_up(h200)
    table = h200["regions"]
    assert table["parameters"] == 60 and table["notes"] == [] and table["unplaced_parameters"] == []
    assert table["attributed_percent"] >= 99.0  # the target is 90
    assert ms(h200, "unattributed") < 0.01 * h200["step_ms"]
    named = sum(ms(h200, r) for r in ORDER if r != "unattributed")
    assert named >= 0.9 * h200["device_ms"]


def test_h200_region_sizes(h200):
    r = rows(h200)
    cats = h200["categories"]
    # attention = the attention kernels + the q, k, v, proj GEMMs (~14 ms/layer-step forward and backward)
    assert r["attention"]["ms_per_step"] > cats["attention"] + 30
    assert r["attention"]["ms_per_step"] > r["MLP"]["ms_per_step"] > r["norms and residuals"]["ms_per_step"]
    assert r["norms and residuals"]["ms_per_step"] > r["head and loss"]["ms_per_step"] > r["embedding"]["ms_per_step"]
    for region in ("attention", "MLP"):  # backward does about twice the forward's work
        assert 1.5 < r[region]["backward_ms"] / r[region]["forward_ms"] < 2.6
    gemm = sum(r[x]["ms_per_step"] for x in MODEL) - cats["attention"] - cats["other compute"]
    assert gemm == pytest.approx(cats["GEMM"], abs=0.3)  # every model GEMM found its layer


def test_a_real_deeper_wider_variant_is_placed_as_well():
    """A real H200 trace of train.py at DEPTH 10 (width 768, 6 heads; current attention: cuDNN for the full
    layers): the regions follow the model's own shapes, with nothing hard-coded for the default size."""
    s = summarize(load_trace(os.path.join(DATA, "h200-depth10-gpt-5steps.trace.json.gz")))
    assert_adds_up(s)
    assert s["regions"]["parameters"] == 74 and s["regions"]["unplaced_parameters"] == []
    assert s["regions"]["attributed_percent"] >= 99.0
    assert s["categories"]["other"] == 0  # cuDNN's backward helpers count as attention
    r = rows(s)
    assert r["attention"]["ms_per_step"] > r["MLP"]["ms_per_step"] > r["head and loss"]["ms_per_step"]


def test_h200_gemms_placed_by_weight_shape(h200_trace):
    ix = index(h200_trace["traceEvents"])
    placer = regions.Placer(regions.Parameters(h200_trace["autoresearch"]["parameters"]))
    expected = {(512, 512): "attention", (4, 32): "attention", (32, 4): "attention", (512, 2048): "MLP",
                (2048, 512): "MLP",
                (8192, 512): "head and loss", (512, 8192): "head and loss"}
    seen = set()
    for op in ix.cpu_ops:
        if op["name"] != "aten::mm":
            continue
        shapes = [tuple(d) for d in op["args"]["Input Dims"]]
        weight = next(s for s in shapes if s in expected)
        assert placer.place("nvjet", "GEMM", op)[0] == ((expected[weight], 1.0),), shapes
        seen.add(weight)
    assert seen == set(expected)


def test_h200_forward_and_backward_match_the_compiled_graphs(h200_trace):
    """The backward graph is annotated on the autograd thread; the rule (launched inside the autograd engine)
    calls every kernel on the GPU span of that graph backward, and every kernel of the forward graph forward."""
    events = h200_trace["traceEvents"]
    ix = index(events)
    windows = backward_windows(by_thread(ix.cpu_ops))
    cpu = {e["args"]["External id"]: e for e in events if e.get("cat") == "user_annotation"}
    graphs = sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and "CompiledFxGraph" in e["name"]),
                    key=lambda e: e["ts"])
    starts = [g["ts"] for g in graphs]
    autograd_tid = next(e["tid"] for e in ix.cpu_ops if e["name"].startswith("autograd::engine"))
    per_step, _ = attribute(ix)
    found = {True: 0.0, False: 0.0}
    for evs in per_step:
        for e, launch in evs:
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i < 0 or e["ts"] >= graphs[i]["ts"] + graphs[i]["dur"]:
                continue
            on_autograd = cpu[graphs[i]["args"]["External id"]]["tid"] == autograd_tid
            assert regions.is_backward(launch, windows) == on_autograd
            found[on_autograd] += e["dur"]
    assert found[True] > 1.5 * found[False] > 0  # both graphs seen; backward is the larger
    # per micro-step: the first graph is the forward (main thread), the second the backward
    names = [(e["name"], e["tid"]) for e in sorted(cpu.values(), key=lambda e: e["ts"]) if "CompiledFxGraph" in e["name"]]
    assert names[0][1] != autograd_tid and names[1][1] == autograd_tid and names[0][0] != names[1][0]


# ---------------------------------------------------------------------------------------------------------
# Variants of the H200 trace: the shapes rewritten as if the agent had edited the model

def rewritten(trace, dims=None, parameters=None):
    """A copy of the trace whose cpu_op `Input Dims` go through dims(list) and whose parameter metadata is
    `parameters` (the events themselves are shared; only rewritten ones are copied)."""
    events = []
    for e in trace["traceEvents"]:
        if dims and e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {}):
            e = dict(e, args=dict(e["args"], **{"Input Dims": dims(e["args"]["Input Dims"])}))
        events.append(e)
    meta = dict(trace["autoresearch"])
    if parameters is not None:
        meta["parameters"] = parameters
    return dict(trace, traceEvents=events, autoresearch=meta)


def mlp_hidden(width):
    """Rewrites the MLP's hidden size (2048 at the default config) to `width` in every shape that has it."""
    tokens, dim = 262144, 512

    def one(d):
        if isinstance(d, list) and len(d) == 2 and 2048 in d and ({dim, tokens} & set(d)):
            return [width if x == 2048 else x for x in d]
        if d == [128, 2048, 2048]:  # B, T, hidden
            return [128, 2048, width]
        return d

    return lambda dims: [one(d) for d in dims]


def params_with(trace, **changes):
    """The trace's parameters with MLP shapes (or names) changed."""
    out = {}
    for name, shape in trace["autoresearch"]["parameters"].items():
        if ".mlp.c_fc." in name and "fc" in changes:
            shape = changes["fc"]
        elif ".mlp.c_proj." in name and "proj" in changes:
            shape = changes["proj"]
        if ".mlp." in name and "rename" in changes:
            name = name.replace(".mlp.c_fc.", ".mixer.w_in.").replace(".mlp.c_proj.", ".mixer.w_out.")
        if not (".mlp." in name and changes.get("drop_mlp")):
            out[name] = shape
    return out


def test_wider_mlp_is_still_placed(h200, h200_trace):
    wide = summarize(rewritten(h200_trace, mlp_hidden(1536), params_with(h200_trace, fc=[1536, 512],
                                                                           proj=[512, 1536])))
    assert_adds_up(wide)
    for region in ORDER:  # same kernels, same times: only the shapes say which layer a GEMM belongs to
        assert ms(wide, region) == pytest.approx(ms(h200, region), abs=1e-3), region
    assert wide["regions"]["attributed_percent"] >= 99.0


def test_unknown_shapes_become_unattributed(h200, h200_trace):
    s = summarize(rewritten(h200_trace, parameters=params_with(h200_trace, drop_mlp=True)))
    assert_adds_up(s)
    moved = ms(h200, "MLP") - ms(s, "MLP")
    assert moved > 40  # the MLP's GEMMs, forward and backward
    assert ms(s, "unattributed") == pytest.approx(ms(h200, "unattributed") + moved, abs=1e-3)
    reasons = {u["reason"] for u in s["regions"]["unattributed"]}
    assert any(r.startswith("GEMM: no parameter has its shapes [262144, 512] x [512, 2048]") for r in reasons)


def test_new_layer_type_is_shown_as_unattributed(h200, h200_trace):
    s = summarize(rewritten(h200_trace, parameters=params_with(h200_trace, rename=True)))
    assert_adds_up(s)
    table = s["regions"]
    assert table["unplaced_parameters_total"] == 16 and table["unplaced_parameters"][0] == "blocks.0.mixer.w_in.weight"
    assert ms(s, "unattributed") > 40 and table["attributed_percent"] < 90
    assert any(u["reason"].startswith("parameter of no known region: blocks.0.mixer") for u in table["unattributed"])
    md = to_markdown(s)
    assert "parameters of no known region (16): `blocks.0.mixer.w_in.weight`" in md


def test_shape_shared_by_two_regions_is_split_by_parameter_count(h200, h200_trace):
    """An MLP of 1x width shares [512, 512] with attention's q, k, v and proj: the GEMM time is split 4:2."""
    s = summarize(rewritten(h200_trace, mlp_hidden(512), params_with(h200_trace, fc=[512, 512], proj=[512, 512])))
    assert_adds_up(s)
    split = next(x for x in s["regions"]["shared_shapes"] if x["shape"] == [512, 512])
    assert split["parameters"] == {"attention": 32, "MLP": 16}
    gemms = split["ms_per_step"]  # all the [512, 512] GEMMs: attention's and the (rewritten) MLP's
    assert ms(s, "attention") + ms(s, "MLP") == pytest.approx(ms(h200, "attention") + ms(h200, "MLP"), abs=1e-2)
    assert "split by parameter count, attention 32, MLP 16" in to_markdown(s)
    assert gemms > 50


def test_tied_head_goes_to_head_and_loss(h200, h200_trace):
    params = {k: v for k, v in h200_trace["autoresearch"]["parameters"].items() if k != "lm_head.weight"}
    s = summarize(rewritten(h200_trace, parameters=params))
    assert ms(s, "head and loss") == pytest.approx(ms(h200, "head and loss"), abs=0.1)


# ---------------------------------------------------------------------------------------------------------
# Without parameter shapes; CPU profiles

def test_h100_without_parameters_places_kernels_by_name():
    s = summarize(load_trace(H100))
    assert_adds_up(s)
    table = s["regions"]
    assert table["parameters"] == 0 and "GEMMs are unattributed" in table["notes"][0]
    assert ms(s, "attention") == pytest.approx(s["categories"]["attention"], abs=1e-3)
    assert ms(s, "unattributed") >= s["categories"]["GEMM"] - 0.01  # every GEMM, and nothing invented
    assert ms(s, "MLP") > 5 and ms(s, "norms and residuals") > 10 and ms(s, "head and loss") > 3
    assert 50 < table["attributed_percent"] < 90
    assert all(u["reason"] == "GEMM: no parameter shapes in the trace metadata" for u in table["unattributed"])


def test_cpu_profile_of_our_gpt():
    """train.py --profile on the CPU (eager, cpu preset: width 128, vocab 512 = the MLP's hidden size)."""
    s = summarize(load_trace(CPU_GPT))
    assert s["kind"] == "cpu"
    assert_adds_up(s)
    table = s["regions"]
    assert table["attributed_percent"] >= 85
    for region in ("attention", "MLP", "head and loss"):
        r = rows(s)[region]
        assert r["forward_ms"] > 0 and r["backward_ms"] > 0, region
    # lm_head [512, 128] has the shape of the MLP's c_fc: 2 MLP matrices per layer and the head share it
    assert {"shape": [512, 128], "parameters": {"MLP": 4, "head and loss": 1}} in \
        [{k: x[k] for k in ("shape", "parameters")} for x in table["shared_shapes"]]
    assert "### Where the step goes in the model" in to_markdown(s) and "% of operator time" in to_markdown(s)


def test_cpu_profile_without_metadata():
    s = summarize(load_trace(CPU_MLP))
    assert_adds_up(s)
    assert ms(s, "head and loss") > 0 and ms(s, "embedding") > 0


# ---------------------------------------------------------------------------------------------------------
# A synthetic trace, computed by hand (times in us)

def synthetic():
    """One step [0, 10000] on thread 1; the autograd engine on thread 2. GPU (stream 7):
    forward GEMM 1000 us (fc weight [32, 16]), fused add 500, backward GEMM 2000 (launched inside
    evaluate_function on thread 2), a kernel no rule knows 300, a memcpy 200, an optimizer kernel 400."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 10000},
          {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1,
           "ts": 8000, "dur": 500},
          {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": 1,
           "tid": 2, "ts": 3000, "dur": 1000, "args": {"External id": 90}}]
    launches = [  # (op name, input dims, thread, launch ts, kernel name, device cat, start, dur)
        ("aten::mm", [[64, 16], [16, 32]], 1, 1000, "nvjet_fwd", "kernel", 11000, 1000),
        ("triton_poi_fused_add_0", [[64, 32]], 1, 2000, "triton_poi_fused_add_0", "kernel", 12000, 500),
        ("aten::mm", [[64, 32], [32, 16]], 2, 3500, "nvjet_bwd", "kernel", 12500, 2000),
        ("aten::weird", [[7, 7]], 1, 5000, "mystery_kernel", "kernel", 14500, 300),
        ("aten::copy_", [[64]], 1, 6000, "Memcpy HtoD", "gpu_memcpy", 15000, 200),
        ("aten::add_", [[32, 16]], 1, 8100, "sgd_kernel", "kernel", 15200, 400),
    ]
    for i, (op, dims, tid, ts, kernel, cat, start, dur) in enumerate(launches):
        ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": tid, "ts": ts, "dur": 50,
                   "args": {"External id": i, "Input Dims": dims}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts + 10,
                   "dur": 5, "args": {"External id": i, "correlation": 100 + i}})
        ev.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                   "args": {"correlation": 100 + i}})
    return {"traceEvents": ev, "autoresearch": {"parameters": {"blocks.0.mlp.fc.weight": [32, 16]}}}


def test_synthetic_trace_by_hand():
    s = summarize(synthetic())
    assert s["step_ms"] == 4.6 and s["idle_ms"] == 0.2  # 11000 -> 15600; busy 4.4 ms
    got = {r["region"]: (r["forward_ms"], r["backward_ms"], r["ms_per_step"]) for r in s["regions"]["rows"]}
    assert got == {
        "embedding": (0.0, 0.0, 0.0), "attention": (0.0, 0.0, 0.0), "MLP": (1.0, 2.0, 3.0),
        "norms and residuals": (0.5, 0.0, 0.5), "head and loss": (0.0, 0.0, 0.0),
        "optimizer": (None, None, 0.4), "data movement": (None, None, 0.2), "unattributed": (0.3, 0.0, 0.3),
        "GPU idle": (None, None, 0.2), "overlap": (None, None, 0.0)}
    table = s["regions"]
    assert table["attributed_percent"] == pytest.approx(100 * (1 - 0.3 / 4.4), abs=1e-3)
    assert table["unattributed"] == [{"name": "mystery_kernel", "raw_name": "mystery_kernel",
                                      "reason": "no rule for its name or shapes", "ms_per_step": 0.3}]


# ---------------------------------------------------------------------------------------------------------
# Report, JSON, changes

def test_report_region_table(h200):
    md = to_markdown(h200)
    lines = md.splitlines()
    i = lines.index("### Where the step goes in the model")
    assert lines.index("## 1. Step budget") < i < lines.index(next(x for x in lines if x.startswith("## 2.")))
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines[i + 1:] if line.startswith("|")]
    table = table[:table.index(next(r for r in table if r[0] == "**step**")) + 1]
    assert table[0] == ["region", "forward ms", "backward ms", "ms/step", "% of step", "TFLOP/s (% of peak)",
                        "GB/s (% of peak)", "bound ms"]
    body = table[2:-1]
    assert [r[0].split(" (")[0] for r in body] == ORDER + ["GPU idle"]
    assert sum(float(r[3]) for r in body) == pytest.approx(h200["step_ms"], abs=0.05)
    assert table[-1][3] == f"**{h200['step_ms']:.2f}**"
    assert float(table[-1][1].strip("*")) + float(table[-1][2].strip("*")) == pytest.approx(
        h200["step_ms"] - ms(h200, "optimizer") - ms(h200, "data movement") - ms(h200, "GPU idle"), abs=0.05)
    assert ">99.9% of device time placed in a named region (60 parameter shapes" in md


def test_json_round_trip(h200):
    assert json.loads(to_json(h200))["regions"] == h200["regions"]


def test_changes_list_regions(h200):
    previous = copy.deepcopy(h200)
    next(r for r in previous["regions"]["rows"] if r["region"] == "MLP")["ms_per_step"] += 5.0
    d = diff(previous, h200)
    assert d["regions"][0]["name"] == "MLP" and d["regions"][0]["change_ms"] == -5.0
    assert "| region: MLP" in to_markdown(h200, previous=previous)
    older = dict(previous, regions=None)  # a summary from before the region table: nothing to compare
    assert diff(older, h200)["regions"] == []


def test_fused_kernels_of_the_current_train_py_are_placed():
    """The H200 trace of issue #9's second round: the hand-written Triton kernels land in their regions and
    categories."""
    s = summarize(load_trace(os.path.join(DATA, "h200-fused-gpt-5steps.trace.json.gz")))
    assert_adds_up(s)
    kernels = {k["name"]: k for k in s["kernels"]}
    assert kernels["softcap_cross_entropy_kernel"]["category"] == "other compute"
    assert kernels["rotary_norm_bwd"]["category"] == "other compute"
    assert regions.name_region("softcap_cross_entropy_kernel") == "head and loss"
    assert regions.name_region("rotary_norm_fwd") == "norms and residuals"
    assert 290 < s["step_ms"] < 305 and ms(s, "head and loss") > 20


def test_cudnn_window_attention_trace_is_placed():
    """The H100 trace after issue #9's third round: cuDNN runs every attention layer (the band-masked
    windows through its Python API), no copy before the rotary backward, and the step adds up."""
    s = summarize(load_trace(os.path.join(DATA, "h100-cudnn-window-gpt-5steps.trace.json.gz")))
    assert_adds_up(s)
    attention = [k for k in s["kernels"] if k["category"] == "attention"]
    assert attention and all("cudnn" in k["raw_name"] for k in attention)
    assert not any("flex" in k["name"] or "fused_view" in k["name"] for k in s["kernels"])
    assert sum(k["calls_per_step"] for k in attention if "bprop" in k["name"]) == 16  # 8 layers x 2 micro-batches
    assert 300 < s["step_ms"] < 315 and ms(s, "attention") > 100
