"""Issue #42 item 2: the model's attention kind from the trace's evidence (profiling/profile/tables/attention_kind.py),
and fixes that never change what the model computes: no is_causal=True for a bidirectional or unknown model,
its FLOPs priced as the attention the model does."""
import pytest

from profiling.profile.findings.kernels import needed_flops
from profiling.profile.report.summary import summarize
from profiling.profile.tables import attention_kind as ak
from profiling.profile.tables.roofline import attention_flops


@pytest.mark.parametrize("name, kind", [
    ("BertSelfAttention", ak.BIDIRECTIONAL), ("transformers/models/vit/modeling_vit.py", ak.BIDIRECTIONAL),
    ("timm/models/vision_transformer.py", ak.BIDIRECTIONAL), ("RobertaLayer", ak.BIDIRECTIONAL),
    ("patch_embed.proj.weight", ak.BIDIRECTIONAL), ("GPT2Attention", ak.CAUSAL), ("LlamaForCausalLM", ak.CAUSAL),
    ("CausalSelfAttention", ak.CAUSAL), ("create_causal_mask", ak.CAUSAL), ("create_bidirectional_mask",
                                                                            ak.BIDIRECTIONAL),
    ("activation", None), ("Bottleneck", None), ("blocks.0.attn.c_q.weight", None), ("Linear", None),
])
def test_names_of_model_families(name, kind):
    assert ak.name_kind(name) == kind


def sdpa(flag, mask=None):
    dims = [[2, 4, 128, 64]] * 3 + ([mask] if mask else [[]])
    return {"name": "aten::scaled_dot_product_attention",
            "args": {"Input Dims": dims, "Concrete Inputs": ["", "", "", "", "0.", flag, "", ""]}}


def test_a_call_says_its_kind_only_where_its_mask_cannot_hide_the_future():
    assert ak.call_kind(sdpa("True")) == ak.CAUSAL
    assert ak.call_kind(sdpa("False")) == ak.BIDIRECTIONAL                   # no mask: every key
    assert ak.call_kind(sdpa("False", [2, 1, 1, 128])) == ak.BIDIRECTIONAL   # a padding mask
    assert ak.call_kind(sdpa("False", [2, 1, 128, 128])) is None             # [T, T]: hides what?
    assert ak.call_kind(sdpa("")) is None


def test_the_strongest_evidence_decides_and_a_conflict_is_unknown():
    meta, none = {}, {ak.CAUSAL: [], ak.BIDIRECTIONAL: []}
    assert ak.decide({ak.CAUSAL: 3}, meta, none, 0).kind == ak.CAUSAL
    assert ak.decide({ak.CAUSAL: 3, ak.BIDIRECTIONAL: 2}, meta, none, 0).kind == ak.UNKNOWN
    # calls outrank names; names outrank a tril
    assert ak.decide({ak.BIDIRECTIONAL: 1}, meta, {ak.CAUSAL: ["GPT2Model"], ak.BIDIRECTIONAL: []}, 5).kind \
        == ak.BIDIRECTIONAL
    assert ak.decide({}, meta, {ak.CAUSAL: [], ak.BIDIRECTIONAL: ["BertModel"]}, 5).kind == ak.BIDIRECTIONAL
    assert ak.decide({}, meta, none, 2).kind == ak.CAUSAL
    assert ak.decide({}, meta, none, 0).kind == ak.UNKNOWN
    assert ak.decide({}, {"trainer": "train.py"}, none, 0).kind == ak.CAUSAL


def test_unrecorded_flags_are_priced_as_the_model_does():
    op = sdpa("")
    assert attention_flops(op, causal=False) == pytest.approx(2 * attention_flops(op, causal=True), rel=0.01)
    assert attention_flops(sdpa("True"), causal=False) == attention_flops(sdpa("True"), causal=True)
    masked = sdpa("False", [128, 128])
    assert attention_flops(masked, force=True) < attention_flops(masked)  # the mask counted as causal


def test_a_library_that_builds_the_mask_is_named_with_the_models_line():
    frames = [["transformers/models/llama/modeling_llama.py", 391, "forward", "causal_mask = create_causal_mask(",
               True], ["transformers/masking_utils.py", 517, "sdpa_mask", "attention_mask = mask_function(", False],
              ["transformers/masking_utils.py", 981, "create_causal_mask", "causal_mask = mask_interface(", False]]
    library, where = ak.builder(frames)
    assert library == "transformers"
    assert where.startswith("create_causal_mask (transformers/masking_utils.py)") and "modeling_llama.py:391" in where
    assert ak.builder([["train.py", 10, "forward", "y = f(x)", True]]) is None


def attention_fallback(s):
    return next(f for f in s["findings"] if f["kind"] == "attention_fallback")


def as_other_model(trace, flag):
    """The dense-mask plant as another script's: its causal calls given is_causal=`flag` ("": no Concrete Inputs),
    no train.py metadata."""
    meta = trace["autoresearch"]
    meta.pop("micro_batches", None)
    meta["trainer"] = "mytrain.py"
    for e in trace["traceEvents"]:
        concrete = (e.get("args") or {}).get("Concrete Inputs")
        if e.get("cat") != "cpu_op" or "attention" not in e["name"] or not concrete or "0." not in concrete:
            continue
        i = next(i for i in range(concrete.index("0.") + 1, len(concrete)) if concrete[i] in ("True", "False"))
        if concrete[i] == "True" and flag:  # is_causal: the first flag after dropout_p (roofline.causal_flag)
            concrete[i] = flag
        elif concrete[i] == "True":
            del e["args"]["Concrete Inputs"]
    return trace


def test_a_dense_mask_in_a_causal_model_keeps_its_causal_fix(data_trace):
    f = attention_fallback(summarize(data_trace("h100-plant-dense_mask")))
    assert "is causal: 8 attention calls are causal" in f["evidence"]
    assert f["fix"].startswith("pass is_causal=True instead of a causal mask")


def test_a_bidirectional_model_is_never_told_is_causal_and_is_priced_in_full(data_trace):
    causal = attention_fallback(summarize(data_trace("h100-plant-dense_mask")))
    s = summarize(as_other_model(data_trace("h100-plant-dense_mask"), "False"))
    f = attention_fallback(s)
    assert "is bidirectional" in f["evidence"]
    assert "is_causal=True instead" not in f["fix"] and "never is_causal=True" in f["fix"]
    assert "[B, 1, 1, T]" in f["fix"]
    # its unmasked calls now do twice the FLOPs in the same time: the reference rate doubles with the work
    assert f["ms_per_step"] == pytest.approx(causal["ms_per_step"], rel=0.01)
    masked = sdpa("False", [128, 128])
    assert needed_flops(masked, ak.BIDIRECTIONAL) == pytest.approx(2 * needed_flops(masked, ak.CAUSAL), rel=0.01)
    assert needed_flops(masked, ak.UNKNOWN) == needed_flops(masked, ak.BIDIRECTIONAL)


def test_an_unknown_model_gets_both_branches_priced_as_full_attention(data_trace):
    f = attention_fallback(summarize(as_other_model(data_trace("h100-plant-dense_mask"), "")))
    assert "is unknown" in f["evidence"] and "were the mask causal, is_causal=True would save" in f["evidence"]
    assert "if the mask hides the future (a causal model), pass is_causal=True" in f["fix"]
    assert "if it hides only padding" in f["fix"]
    if_causal = float(f["evidence"].split("would save ")[1].split(" ms")[0])
    assert f["ms_per_step"] < if_causal  # priced as full attention: the smaller gain of the two branches


@pytest.mark.parametrize("kind", [ak.BIDIRECTIONAL, ak.UNKNOWN])
def test_matmul_softmax_attention_of_a_model_that_is_not_known_causal(data_trace, monkeypatch, kind):
    """BERT-base's matmul + softmax attention was told is_causal=True: on the sdp_math plant (attention on the
    math path, its settings record dropped so the rule's own fix shows), a model that attends both ways gets
    SDPA without is_causal and twice the target time (every score is needed); an unknown one both branches."""
    def math(k):
        trace = data_trace("h100-plant33-sdp_math")
        trace["autoresearch"].pop("settings")
        if k:
            monkeypatch.setattr(ak, "of", lambda tl: ak.Kind(k, "test", None))
        return next(f for f in summarize(trace)["findings"] if f["kind"] == "math_attention")
    causal, other = math(None), math(kind)
    assert "is_causal=True)" in causal["fix"] and "causal attention's FLOPs" in causal["evidence"]
    assert "full attention's FLOPs" in other["evidence"]
    assert other["ms_per_step"] < causal["ms_per_step"]
    if kind == ak.BIDIRECTIONAL:
        assert "is_causal=True" not in other["fix"].replace("never is_causal=True", "")
    else:
        assert "is_causal=True only if" in other["fix"] and "were it causal" in other["evidence"]


@pytest.mark.slow  # importing transformers: ~5 s
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_a_transformers_bert_reads_as_bidirectional(tmp_path, implementation):
    """A tiny BERT of transformers, profiled on the CPU with its module scopes: its matmul + softmax attention
    (eager) or its SDPA calls say it attends both ways, whatever padding mask it is given."""
    transformers = pytest.importorskip("transformers")
    import types

    import torch
    from torch.profiler import ProfilerActivity, profile

    from profiling.profile.report.summary import load_trace
    from profiling.profile.trace.traceio import by_thread, index, parents
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, attn_implementation=implementation)
    model = transformers.BertModel(cfg).eval()
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0  # padding
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True) as prof:
        model(torch.randint(0, 100, (2, 16)), attention_mask=mask)
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    ix = index(load_trace(str(tmp_path / "t.json"))["traceEvents"])
    kind = ak.of(types.SimpleNamespace(ix=ix, parent=parents(by_thread(ix.cpu_ops)), meta={}))
    assert kind.kind == ak.BIDIRECTIONAL, kind
