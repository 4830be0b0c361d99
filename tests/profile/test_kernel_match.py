"""profiling.profile.report.kernel_match: the changes table pairs kernels across recompiles, on real H100 traces.

h100-plant-baseline is a clean default-config run; h100-plant-<case> is the same train.py with one planted
change (benchmarks/findings/planted/diagnoses.py); h100-cudnn-window-gpt-5steps is an earlier compile of
nearly the same train.py. Matched by raw name, a renumbered kernel shows as a pair: one gone, one new, of the
same size.
"""
import copy
import os
import re

import pytest

from profiling.profile.report.kernel_match import match, match_key
from profiling.profile.report.render import to_markdown
from profiling.profile.report.summary import diff
from profiling.profile.trace.classify import inductor_kernel

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
OLD_FIELDS = {"name", "raw_name", "category", "previous", "current", "change_ms", "change_pct"}


@pytest.fixture(scope="module")
def summaries(data_summary):
    """summaries(name) -> the fixture's summary (conftest's data_summary: made once per run, a fresh copy)."""
    return data_summary


def rename_pairs(d):
    """(gone, new) kernel rows of one category whose names differ only in their number, views and casts (as
    readable names leave them out) or the order of their ops: the same kernel under two names, as matching by
    raw name shows a recompile's renumbering (e.g. -11.36 `triton_poi_fused_pow_relu_7` and +11.35
    `triton_poi_fused_pow_relu_8`)."""
    def base(k):
        parts = inductor_kernel(k["raw_name"])
        if parts is None:
            return k["category"], re.sub(r"_\d+$", "", k["raw_name"])
        return k["category"], parts[0], tuple(sorted(parts[1].split("_")))

    gone = [k for k in d["kernels"] if not k["current"]]
    new = [k for k in d["kernels"] if not k["previous"]]
    return [(g["name"], n["name"]) for g in gone for n in new if base(g) == base(n)]


def row(d, pattern):
    found = [k for k in d["kernels"] if re.search(pattern, k["raw_name"])]
    assert len(found) == 1, [k["name"] for k in found]
    return found[0]


# ---------------------------------------------------------------------------------------------------------
# The key

@pytest.mark.parametrize("a, b", [
    ("triton_poi_fused__to_copy__unsafe_view_pow_relu_7", "triton_poi_fused_pow_relu_4"),
    ("triton_poi_fused_pow_relu_4", "triton_poi_fused_relu_pow_8"),  # op list in another order
    ("triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_threshold_backward_view_3",
     "triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_scalar_tensor_threshold_backward_view_3"),
    ("triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_threshold_backward_view_3",
     "triton_poi_fused__to_copy__unsafe_view_mul_pow_relu_t_threshold_backward_view_2"),
    ("triton_red_fused__fused_rms_norm__fused_rms_norm_backward_add_mul_select_slice_backward_view_19",
     "triton_red_fused__fused_rms_norm__fused_rms_norm_backward_add_mul_select_slice_backward_view_24"),
    ("_rotary_norm_fwd_0", "_rotary_norm_fwd_3"),
    ("_rotary_norm_fwd", "_rotary_norm_fwd_1"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"),
])
def test_same_kernel_under_another_compile_number(a, b):
    assert match_key(a, "other compute") == match_key(b, "other compute")


@pytest.mark.parametrize("a, b", [
    ("triton_per_fused_add_mul_3", "triton_poi_fused_add_mul_3"),               # another kind of kernel
    ("triton_poi_fused_add_mul_3", "triton_poi_fused_add_mul_sigmoid_3"),       # another op
    ("triton_poi_fused__to_copy_2", "triton_poi_fused__to_copy_t_3"),           # only views: they count
    ("triton_per_fused__fused_rms_norm__unsafe_view_add_mul_select_11",
     "triton_per_fused__fused_rms_norm__fused_rms_norm_backward_add_mul_select_sum_view_21"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_64x1_nn_align2>(x)",
     "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_64x1_tn_align2>(x)"),
])
def test_different_kernels_keep_apart(a, b):
    assert match_key(a, "other compute") != match_key(b, "other compute")


def test_category_is_part_of_the_key():
    raw = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert match_key(raw, "GEMM") != match_key(raw, "optimizer")


# ---------------------------------------------------------------------------------------------------------
# Rows: groups, new and gone

def kernel(raw, ms, category="other compute"):
    return {"name": raw, "raw_name": raw, "category": category, "ms_per_step": ms}


def test_kernels_of_one_key_are_compared_as_a_group_never_paired():
    before = [kernel("triton_poi_fused_add_mul_3", 1.0), kernel("triton_poi_fused_add_mul_5", 2.0)]
    now = [kernel("triton_poi_fused_add_mul_4", 2.5), kernel("triton_poi_fused_add_mul_6", 1.0),
           kernel("triton_poi_fused_add_mul_9", 0.5)]
    [r] = match(before, now)
    assert (r["previous"], r["current"], r["match"]) == (3.0, 4.0, "group")
    assert r["name"] == "triton_poi_fused_add_mul_* (2 -> 3 kernels)"
    assert r["previous_raw_names"] == ["triton_poi_fused_add_mul_5", "triton_poi_fused_add_mul_3"]
    assert r["raw_name"] == "triton_poi_fused_add_mul_4"


def test_a_kernel_that_appears_or_disappears_shows_as_such():
    before = [kernel("triton_poi_fused_pow_relu_7", 11.0), kernel("nvjet_sm90_tst_a_NNT", 5.0, "GEMM")]
    now = [kernel("triton_poi_fused_pow_relu_2", 11.0), kernel("sm90_xmma_gemm_f32f32_kernel", 9.0, "GEMM")]
    rows = {r["match"]: r for r in match(before, now)}
    assert set(rows) == {"renamed", "new", "gone"}
    assert (rows["renamed"]["previous"], rows["renamed"]["current"]) == (11.0, 11.0)
    assert rows["renamed"]["name"] == "triton_poi_fused_pow_relu_2"
    assert (rows["new"]["previous"], rows["new"]["current"]) == (None, 9.0)
    assert (rows["gone"]["previous"], rows["gone"]["current"]) == (5.0, None)


def test_rows_name_one_thing_each():
    groups = [kernel("triton_poi_fused_add_mul_3", 1.0), kernel("triton_poi_fused_add_mul_5", 2.0),
              kernel("triton_poi_fused_add_mul_4", 1.0, "optimizer"),
              kernel("triton_poi_fused_add_mul_7", 1.0, "optimizer")]
    names = [r["name"] for r in match(groups, groups)]
    assert names == ["triton_poi_fused_add_mul_* (2 kernels) (other compute)",
                     "triton_poi_fused_add_mul_* (2 kernels) (optimizer)"]

    def split_k(n, ms, name):
        return dict(kernel(f"void splitKreduce_kernel<{n}>()", ms), name=name)

    before = [split_k(1, 0.4, "splitKreduce_kernel #1"), split_k(2, 0.1, "splitKreduce_kernel #2")]
    now = [before[0], split_k(3, 0.2, "splitKreduce_kernel #2")]  # another kernel, #2 in its own profile
    assert [(r["name"], r["match"]) for r in match(before, now)] == [
        ("splitKreduce_kernel #1", "same"), ("splitKreduce_kernel #2", "new"),
        ("splitKreduce_kernel #3", "gone")]


# ---------------------------------------------------------------------------------------------------------
# Real traces

def renumbered(s):
    """The summary `s` as another compile could name it: every numbered kernel gets another number, and the
    MLP's and the norms' Inductor kernels lose a cast and gain a view (their op list out of order)."""
    s = copy.deepcopy(s)
    for k in s["kernels"]:
        raw = re.sub(r"_(\d+)$", lambda m: f"_{int(m[1]) + 17}", k["raw_name"])
        if "relu" in raw or "rms_norm" in raw:
            raw = raw.replace("__to_copy", "").replace("_mul_", "_mul_view_")
        k["raw_name"] = k["name"] = raw
    return s


def test_a_recompile_that_only_renumbers_is_no_change(summaries):
    s = summaries("h100-plant-baseline")
    other = renumbered(s)
    assert sum(a["raw_name"] != b["raw_name"] for a, b in zip(s["kernels"], other["kernels"])) > 80
    d = diff(s, other, top=None)
    assert rename_pairs(d) == []
    assert all(k["previous"] == k["current"] and k["change_ms"] == 0 for k in d["kernels"])
    assert {k["match"] for k in d["kernels"]} == {"same", "renamed", "group"}


def test_two_compiles_of_the_same_train_py(summaries):
    d = diff(summaries("h100-cudnn-window-gpt-5steps"), summaries("h100-plant-baseline"), top=None)
    assert rename_pairs(d) == []
    assert not [k["name"] for k in d["kernels"] if k["match"] in ("new", "gone")]
    assert max(abs(k["change_ms"]) for k in d["kernels"]) < 1.0


def test_two_fresh_compiles_of_one_commit(summaries):
    """h100-compile-a/-b: the same commit compiled twice on one H100 (fresh Inductor caches; the machine's host
    was slow in both, so their GPU idle differs: the kernels must not)."""
    d = diff(summaries("h100-compile-a"), summaries("h100-compile-b"), top=None)
    assert rename_pairs(d) == []
    assert not [k["name"] for k in d["kernels"] if k["match"] in ("new", "gone")]
    assert max(abs(k["change_ms"]) for k in d["kernels"]) < 1.0


def test_a_one_line_change_tops_the_kernel_rows(summaries):
    """h100-oneline-gelu: train.py's MLP with F.gelu instead of relu().square(), compiled on the same H100."""
    d = diff(summaries("h100-compile-b"), summaries("h100-oneline-gelu"))
    top = sorted((k["match"], "gelu" in k["raw_name"], "relu" in k["raw_name"]) for k in d["kernels"][:4])
    assert top == [("gone", False, True)] * 2 + [("new", True, False)] * 2
    assert rename_pairs(diff(summaries("h100-compile-b"), summaries("h100-oneline-gelu"), top=None)) == []


@pytest.mark.parametrize("case", ["dense_mask", "fp32_mlp", "nan_check", "small_batch"])
def test_a_one_line_change_has_no_rename_pairs(summaries, case):
    d = diff(summaries("h100-plant-baseline"), summaries(f"h100-plant-{case}"), top=None)
    assert rename_pairs(d) == []
    assert all(OLD_FIELDS <= set(k) for k in d["kernels"])  # --json stays readable by older readers


def test_dense_mask_top_rows_are_its_attention_kernels(summaries):
    d = diff(summaries("h100-plant-baseline"), summaries("h100-plant-dense_mask"))
    assert [k["raw_name"][:44] for k in d["kernels"][:2]] == \
        ["cudnn_generated_fort_native_sdpa_sm90_flash_", "cudnn_generated_fort_native_sdpa_sm90_flash_"]
    assert d["kernels"][0]["change_ms"] > 80 and d["kernels"][1]["change_ms"] > 20
    relu = row(diff(summaries("h100-plant-baseline"), summaries("h100-plant-dense_mask"), top=None),
               r"_pow_relu_\d+$")  # renumbered _7 -> _8 by the recompile: no change
    assert relu["match"] == "renamed" and abs(relu["change_ms"]) < 0.01
    assert any("renamed by the recompile" in n for n in d["notes"])


def test_fp32_mlp_top_rows_are_its_mlp_kernels(summaries):
    d = diff(summaries("h100-plant-baseline"), summaries("h100-plant-fp32_mlp"))
    top = {k["raw_name"]: k for k in d["kernels"]}
    assert sum(k["match"] == "new" and "f32f32" in raw for raw, k in top.items()) == 2  # fp32 GEMMs appear
    relu_backward = [k for raw, k in top.items() if "relu_t_threshold_backward" in raw]
    assert relu_backward and relu_backward[0]["match"] == "renamed" and relu_backward[0]["change_ms"] > 15


def test_nan_check_new_kernels_show_as_new(summaries):
    d = diff(summaries("h100-plant-baseline"), summaries("h100-plant-nan_check"), top=None)
    isnan = row(d, r"^triton_red_fused_any_isnan_\d+$")
    assert isnan["match"] == "new" and isnan["name"] == "triton_red_fused_any_isnan_* (2 kernels)"


def test_the_report_changes_table_has_one_row_per_change(summaries):
    md = to_markdown(summaries("h100-plant-dense_mask"), previous=summaries("h100-plant-baseline"))
    changes = md[md.index("## 4. Changes"):]
    kernels = [line for line in changes.splitlines() if line.startswith("| kernel: ")]
    assert kernels[0].startswith("| kernel: `cudnn_generated_fort_native_sdpa_flash_bprop")
    assert not any("pow_relu" in line for line in kernels)
    assert "note: 5 kernels renamed by the recompile" in changes
