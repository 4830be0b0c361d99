"""profiling.profile.report.render: the Markdown report the agent reads, and the JSON twin."""
import copy
import json
import os
import re

import pytest

from profiling.profile.report.render import to_json, to_markdown
from profiling.profile.report.summary import load_trace, summarize

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
H100 = os.path.join(DATA, "h100-compiled-gpt-5steps.trace.json.gz")
CPU = os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")
META = {"unprofiled_step_ms": 88.5, "tokens_per_step": 131072, "torch": "2.11.0", "commit": "abc1234",
        "peak_memory_mb": 45060.2, "flops_per_step": 3.9e13, "peak_flops": 989.5e12}


@pytest.fixture(scope="module")
def h100():
    trace = load_trace(H100)
    trace["autoresearch"] = META
    return summarize(trace)


@pytest.fixture(scope="module")
def cpu():
    return summarize(load_trace(CPU))


def cells(line):
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(markdown):
    """Every GitHub table in the text, as lists of rows of cells; asserts that each one is well formed."""
    found, block = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            assert len(block) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", block[1]), block[:2]
            widths = {len(cells(row)) for row in block}
            assert len(widths) == 1, f"rows with different cell counts: {block}"
            found.append([cells(row) for i, row in enumerate(block) if i != 1])
        block = []
    return found


def test_report_layout(h100):
    md = to_markdown(h100)
    lines = md.splitlines()
    assert lines[0] == "# Profile: 88.46 ms/step"
    assert lines[1] == "NVIDIA H100 80GB HBM3 · torch 2.11.0 · 5 steps profiled · 131,072 tokens/step · commit abc1234"
    heads = [line for line in lines if line.startswith("## ")]
    assert heads == ["## 0. Findings (start here: the tables below are their evidence)", "## 1. Step budget",
                     "## 2. Top 10 kernels per step (of 45)", "## 3. Checks"]
    assert "### Where the step goes in the model" in lines and "### Host time inside CUDA calls" in lines
    assert "CHECK FAILED" not in md
    assert re.search(r"^MFU \d+\.\d% · peak memory 45,060 MB · \d\.\d+M tokens/s$", md, re.MULTILINE)
    assert len(tables(md)) == 5  # budget, regions, CUDA calls, kernels, checks


@pytest.mark.parametrize("given, header, rates", [
    (dict(tokens_per_step=1024, samples_per_step=16), "1,024 tokens/step · 16 samples/step",
     r"peak memory [^·]+ · [\d,]+ tokens/s · [\d,]+\.\d samples/s$"),  # units by size: 36,193, not 0.036M
    (dict(samples_per_step=16), "16 samples/step", r"peak memory [^·]+ · [\d,]+\.\d samples/s$"),
    ({}, "tokens/step unknown", r"peak memory [^·]+$"),
])
def test_samples_per_second_beside_tokens_per_second(cpu, given, header, rates):
    s = dict(cpu, **given)
    step_s = s["step_ms"] / 1e3
    s.update(tokens_per_second=given.get("tokens_per_step", 0) / step_s or None,
             samples_per_s=given.get("samples_per_step", 0) / step_s or None)
    md = to_markdown(s)
    line = next(x for x in md.splitlines() if x.startswith("CPU · torch"))
    assert line.endswith(header) and ("tokens/step unknown" in md) == (not given)
    budget = md.split("## 1. Step budget")[1]
    assert re.search(r"^MFU n/a · " + rates, budget, re.MULTILINE), budget
    assert json.loads(to_json(s))["samples_per_s"] == s["samples_per_s"]


def test_budget_parts_add_up_to_the_step(h100):
    budget = tables(to_markdown(h100))[0]
    assert budget[0] == ["part", "ms/step", "% of step"]
    parts = [row for row in budget[1:] if not row[0].startswith("**")]
    assert [row[0].split(" ")[0] for row in parts] == ["GEMM", "attention", "other", "optimizer", "memory", "GPU"]
    assert sum(float(row[1]) for row in parts) == pytest.approx(h100["step_ms"], abs=0.05)
    assert sum(float(row[2]) for row in parts) == pytest.approx(100, abs=0.2)
    assert budget[-1] == ["**step**", "**88.46**", "**100.0**"]


def test_kernel_table(h100):
    kernels = tables(to_markdown(h100, top=5))[3]
    assert kernels[0] == ["#", "kernel", "category", "ms/step", "% of step", "calls/step", "achieved (% of peak)"]
    assert len(kernels) == 6
    assert kernels[1][:6] == ["1", "`nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT`", "GEMM", "11.41", "12.9", "49"]
    assert kernels[1][6] == "-"  # recorded without shapes: no FLOPs, no rate (tests/profile/test_roofline.py has them)
    md = to_markdown(h100)
    assert "this trace recorded no input shapes (record_shapes=False)" in md  # the dashes say why
    assert "over the region's whole time" not in md


def test_cpu_step_time_explained_is_a_note_not_a_failure():
    s = summarize(load_trace(os.path.join(DATA, "cpu-gpt-2steps.trace.json.gz")))
    md = to_markdown(s)
    assert "CHECK FAILED" not in md
    first = md.splitlines()[0]
    assert first.startswith("note: profiled vs unprofiled step time: 85.40 ms profiled vs 67.53 ms unprofiled "
                            "(+26.5%, limit ±3%); 4,671 operators/step x 3.8 us") and first.endswith("cannot hold")
    assert ["profiled vs unprofiled step time", "explained"] == [t for t in tables(md) if t[0][0] == "check"][0][2][:2]
    del s["checks"][1]["explained"]  # an excess the operators cannot explain fails as before
    assert to_markdown(s).startswith("CHECK FAILED: profiled vs unprofiled step time")


def test_failed_check_is_at_the_very_top(h100):
    s = copy.deepcopy(h100)
    s["checks"][1] = {"name": "profiled vs unprofiled step time", "ok": False,
                      "detail": "95.00 ms profiled vs 88.50 ms unprofiled (+7.3%, limit ±3%)"}
    md = to_markdown(s)
    assert md.splitlines()[0] == ("CHECK FAILED: profiled vs unprofiled step time: 95.00 ms profiled vs "
                                  "88.50 ms unprofiled (+7.3%, limit ±3%)")
    assert ["profiled vs unprofiled step time", "FAILED"] == tables(md)[4][2][:2]


def test_other_kernels_shown_by_name_and_pipes_escaped(h100):
    s = copy.deepcopy(h100)
    s["categories"]["other"] = 1.0
    s["categories"]["idle"] -= 1.0
    s["other_kernels"] = ["weird|kernel", "my_kernel"]
    s["kernels"][0]["name"] = "a|b`c"
    md = to_markdown(s)
    budget, _, _, kernels = tables(md)[:4]
    assert ["other: `weird\\|kernel`, `my_kernel`", "1.00", "1.1"] in budget
    assert kernels[1][1] == "`a\\|b'c`"


def test_cpu_report_says_so_at_the_top(cpu):
    md = to_markdown(cpu, top=5)
    assert md.splitlines()[0].startswith("CPU profile: this trace has no GPU timeline")
    assert "# Profile: " in md and "(CPU)" in md and "CPU · torch unknown · 2 steps profiled" in md
    # its second step (51.6 ms against 18.1 and 15.2) on a line of its own at the top, out of the figures
    assert sum(line.startswith("one-off, not per step: profiled step 2 of 3 (`ProfilerStep#") for line in
               md.split("\n\n")[0].splitlines()) == 1
    budget, _, ops, _ = tables(md)
    assert any(row[0].startswith("outside operators") for row in budget)
    assert ops[0][1] == "op" and len(ops) == 6
    assert "GPU idle" not in md


def test_changes_since_previous(h100):
    previous = copy.deepcopy(h100)
    previous["commit"] = "0000000"
    previous["step_ms"] += 2.0
    previous["categories"]["GEMM"] += 2.0
    previous["kernels"][1]["ms_per_step"] += 2.0
    md = to_markdown(h100, previous=previous)
    assert "## 4. Changes since the previous profile (0000000 -> abc1234)" in md
    assert "step: 90.46 -> 88.46 ms/step (-2.00 ms, -2.2%)" in md
    changes = tables(md)[5]
    assert changes[0] == ["what", "before ms/step", "now ms/step", "change ms/step"]
    assert changes[1] == ["category: GEMM", "35.44", "33.44", "-2.00"]
    # flex attention's two backward kernels share an op list: compared as one group (kernel_match.py)
    assert changes[2] == ["kernel: `triton_tem_fused_flex_attention_backward_* (2 kernels)`",
                          "17.77", "15.77", "-2.00"]


def test_unchanged_previous(h100):
    md = to_markdown(h100, previous=h100)
    assert "no category or kernel moved by 0.01 ms/step or more" in md
    tables(md)


@pytest.mark.parametrize("which", ["h100", "cpu"])
def test_json_round_trips(which, request):
    s = request.getfixturevalue(which)
    text = to_json(s)
    assert json.loads(text) == s
    assert to_json(json.loads(text)) == text
