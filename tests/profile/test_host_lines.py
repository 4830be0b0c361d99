"""The host's cost on the user's lines, and the mechanism a line shows (issue #56; profiling/profile/findings/lines.py).

Fixtures: real H200 traces of benchmarks/findings/live/eager_mistakes.py's loops (2026-11-28), each a common eager
mistake profiled through profiling.Profiler, two profiled steps kept (tests/data/trim_trace.py); the cuDNN one
whole. What their fixes recovered, timed unprofiled in fresh processes, is in
benchmarks/findings/live/eager_mistakes_results.md.
"""
import re

import pytest

from profiling.profile.findings.lines import LOOP_MIN, MAX_BODY, loop


@pytest.fixture
def findings(data_summary):
    """findings(case) -> ({kind: finding}, [kinds in order]) of the case's fixture (conftest's data_summary: each
    summary made once per run, shared with the sweeps over every fixture)."""
    def of(case):
        s = data_summary(f"h200-eager-{case}")
        return {f["kind"]: f for f in s["findings"]}, [f["kind"] for f in s["findings"]]
    return of


def test_a_block_repeated_in_a_row_is_a_loop_and_a_stack_of_layers_is_not():
    body = ["aten::select", "aten::to", "aten::cross_entropy_loss"]
    assert loop(body * 512 + ["aten::stack", "aten::mean"]) == (tuple(body), 512)
    assert loop(["aten::item"] * 1024) == (("aten::item",), 1024)
    assert loop(body * (LOOP_MIN - 1)) == (None, 0)  # too few times
    layer = [f"aten::op{i}" for i in range(MAX_BODY + 4)]  # a layer's many operators, 24 layers
    assert loop(layer * 24) == (None, 0)


@pytest.mark.parametrize("case, kind, line, words, fix", [
    ("ema-state-dict", "per_parameter_loop", "`ema_v.copy_(ema_v * decay + (1.0 - decay) * model_v)`",
     "once per parameter tensor (149 tensors)", "torch._foreach_lerp_(ema_params, params, 1 - decay)"),
    ("param-group-each", "per_parameter_loop", "`self.opt.step()`", "one param group per tensor",
     "one param group per distinct setting"),
    ("item-per-sample", "python_loop", "zip(pred, y))`", "1024 of them host syncs", "read the result once"),
    ("lstm-cell-loop", "python_loop", "`h, c = cell(e[:, t], (h, c))`", "`aten::lstm_cell`) 64 times in a row",
     "nn.LSTM / nn.GRU over the whole sequence"),
    ("host-gather", "python_loop", " for i in idx]).to(dev)", "on the host (its operators "
     "launch no kernel)", "keep the data on the GPU and index it there"),
    ("mask-on-host", "host_tensor", "`mask = torch.tril(torch.ones(t, t, dtype=torch.bool)).to(x.device)`",
     "`aten::ones`, `aten::tril` run on the host", "register_buffer"),
])
def test_each_mistake_is_named_at_its_line_with_its_mechanism_and_remedy(findings, case, kind, line, words, fix):
    found, _ = findings(case)
    assert kind in found, found.keys()
    f = found[kind]
    assert line in f["evidence"] and words in f["evidence"], f["evidence"]
    assert fix in f["fix"] and f["fix"].startswith("at eager_mistakes.py:"), f["fix"]
    assert f["ms_per_step"] > 0


def test_a_loop_body_of_several_lines_is_one_loop_named_at_the_caller_that_gathers_it(findings):
    """Attention heads as a ModuleList called in a comprehension: each of Head.forward's four lines runs 36 times a
    step (6 heads x 6 layers); one finding for the four, at the comprehension (the heads batched: -37.1 ms/step)."""
    found, order = findings("heads-loop")
    assert order[0] == "python_loop"
    f = found["python_loop"]
    assert "with 293, 294, 295 a loop body of 4 lines run 36 times a step" in f["evidence"]
    assert "called from eager_mistakes.py:304 `return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))`" in \
        f["evidence"] and "these lines' host work" in f["evidence"]
    assert f["fix"].startswith("at eager_mistakes.py:304: one call over all the loop's iterations")


@pytest.mark.parametrize("case", ["item-per-sample", "lstm-cell-loop"])
def test_a_loop_that_holds_most_of_the_idle_comes_first(findings, case):
    """Where the mistake is most of the GPU's idle, its finding leads, ahead of the effect (launch_bound, host_sync)
    that it causes; before, item-per-sample led with launch_bound (2.36 ms/step) and host_sync (1.46) where the
    fix recovered 13.1."""
    found, order = findings(case)
    assert order[0] == "python_loop"
    assert found["python_loop"]["ms_per_step"] > 5 * max(found[k]["ms_per_step"] for k in order[1:3])


def test_launch_bound_names_the_lines_it_waits_on(findings):
    found, _ = findings("ema-state-dict")
    assert "it waits on the launches of eager_mistakes.py:81" in found["launch_bound"]["evidence"]
    assert "`logits = self.model(self.x)`" in found["launch_bound"]["evidence"]


def test_launch_bound_prices_compiling_by_the_launches_it_removes_so_the_mistake_leads(findings):
    """An EMA over state_dict() beside an eager GPT-2-small-sized model: launch_bound used to price the model
    line's whole idle (14.3 ms/step on the whole trace) and led, where compiling the model recovered 9.1 and the
    mistake's fix 15.5. Its price is now what compiling saves: the model's fusible kernels it would no longer
    launch, at the host's time per launch; the mistake's line leads."""
    found, order = findings("ema-state-dict")
    assert order[0] == "per_parameter_loop"
    f = found["launch_bound"]
    idle = float(f["evidence"].split("GPU idle between kernels ")[1].split(" ms/step")[0])
    saves = float(f["evidence"].split("of the host's time: ~")[1].split(" ms/step")[0])
    assert f["ms_per_step"] == pytest.approx(saves, abs=0.01) and saves < idle / 2
    assert "fewer kernels a step" in f["evidence"] and "only fewer steps per sample amortize" in f["evidence"]
    assert f["fix"].startswith("fewer, larger kernels: torch.compile the model") and "then a larger micro-batch" \
        in f["fix"] and "it changes the optimization" in f["fix"]


@pytest.mark.parametrize("name, lines", [
    # GPT-2 from transformers' own config: Conv1D's addmm, 48 calls a step (4 weights x 12 layers)
    ("h200-public-hf-gpt2-eager", ("transformers/pytorch_utils.py:119",)),
    # torchvision's ResNet-50: each Bottleneck line runs 16 times a step (its conv, its norm, its ReLU, its add)
    ("h200-public-resnet50-eager", ("torchvision/models/resnet.py:150", "torchvision/models/resnet.py:148")),
])
def test_a_stack_of_layers_is_no_python_loop(data_summary, name, lines):
    """Public models nobody planted a mistake in (benchmarks/findings/live/compile_price.py, H200): a library line
    run once per layer is a stack of layers, each call with weights of its own, not a loop to vectorize; before,
    both led with python_loop at a library line ("vectorize the loop": no edit a user can make)."""
    s = data_summary(name)
    assert "python_loop" not in [f["kind"] for f in s["findings"]]
    assert s["findings"][0]["kind"] == "launch_bound"
    rows = {f"{r['file']}:{r['line']}": r for r in s["host_lines"]["rows"]}
    for line in lines:
        assert line not in rows or rows[line]["mechanism"] is None, rows.get(line)


def test_the_gaps_a_mechanism_prices_are_not_priced_again(findings, data_summary):
    """The optimizer's per-group launches are the finding's; launch_bound keeps the model's idle only."""
    found, _ = findings("param-group-each")
    assert "self.opt.step()" not in found["launch_bound"]["evidence"]
    total = sum(f["ms_per_step"] for f in found.values())
    assert total <= data_summary("h200-eager-param-group-each")["step_ms"]


def test_cudnn_benchmark_on_a_new_shape_each_step_is_named_as_the_autotuner(findings):
    found, order = findings("cudnn-benchmark-varlen")
    assert order[0] == "alloc_churn"
    f = found["alloc_churn"]
    assert "cuDNN benchmark is on" in f["evidence"] and "torch.backends.cudnn.benchmark = False" in f["fix"]
    assert "empty_cache" not in f["fix"]


def test_on_the_cpu_a_loop_is_priced_by_its_operators_time_and_eager_code_does_not_price_it_again(data_summary):
    """A loss per sample on the CPU (benchmarks/findings/live/eager_mistakes.py's per_sample_loss, this machine,
    2026-11-28): 154 ms/step unprofiled, 6.3 with one cross_entropy over the batch. Before, the top finding was
    eager_code at 20.9 ms/step, its chains inside the loop; now the loop's line, its operators' whole time."""
    s = data_summary("cpu-per-sample-loss")
    kinds = [f["kind"] for f in s["findings"]]
    assert kinds[0] == "python_loop" and "eager_code" not in kinds
    f = s["findings"][0]
    assert "a block of 4 (`aten::select`, `aten::to`, `aten::cross_entropy_loss`) 512 times in a row" in f["evidence"]
    assert "kernel" not in f["evidence"] and "GPU" not in f["fix"]
    assert 0.5 * (153.9 - 6.3) <= f["ms_per_step"] <= 1.5 * (153.9 - 6.3)
    assert "a Python loop on one line" in s["not_run"]


@pytest.mark.parametrize("name, line, remedy", [
    ("h200-eager-ema-state-dict", "`self.opt.step()`", "fused=True (Adam, AdamW, SGD) or foreach=True"),
    ("h100-lightning-compiled-callback", "`trainer.fit(module, loader)`", "inside the training framework's loop"),
    ("h100-clock-launch_blocking", "`def forward(self, idx, targets=None, reduction=\"mean\"):`",
     "the forward launching its operators"),
])
def test_host_work_at_a_library_call_gets_the_librarys_remedy_not_make_it_cheaper(data_summary, name, line, remedy):
    """gpu_waits_on_host's sampled line hands its work to a library (autograd, the optimizer, a trainer, a forward's
    launches): "make the host work at `loss.backward()` cheaper" is no edit anyone can make (issue #56, item 4)."""
    f = next(f for f in data_summary(name)["findings"] if f["kind"] == "gpu_waits_on_host")
    assert line in f["evidence"].split("the host meanwhile:")[1], f["evidence"]
    assert remedy in f["fix"] and "cheaper" not in f["fix"], f["fix"]


def test_host_work_at_loss_backward_is_autograds_launches():
    """The remedy text for a sampled `loss.backward()` line (the ViT fixture's gpu_waits_on_host had it until its
    per-parameter AdamW was priced by its host time, which leaves no idle for it)."""
    from types import SimpleNamespace

    from profiling.profile.findings.idle import _host_fix
    tl = SimpleNamespace(ix=SimpleNamespace(graph_calls=()), meta={})  # all _host_fix reads of a timeline
    fix = _host_fix(tl, "train.py:96", "loss.backward()")
    assert "autograd launching the backward's kernels" in fix and "cheaper" not in fix


def test_a_per_parameter_update_is_priced_by_its_host_time_up_to_the_idle_it_delays(data_summary):
    """A host-paced loop loses a line's whole host time, not only the idle that waits on its own launches: the
    GPU was still running earlier work as the line began, and the rest of the line's time delays every launch
    after it (issue #56 item 5). The ViT's single-tensor AdamW: fused=True recovered 12.8 ms/step (H100,
    any_model_results.md); its own gaps hold 7.3 ms/step, the idle after them the rest of the step's 9.5."""
    f = next(f for f in data_summary("h100-any-vit-b16-compiled-api")["findings"] if f["kind"] == "per_parameter_loop")
    assert "the host spent 11.0 ms/step there" in f["evidence"], f["evidence"]
    assert 9.0 <= f["ms_per_step"] <= 9.6  # never more than the step's idle (9.5 ms/step unprofiled)
    assert 0.5 * 12.8 <= f["ms_per_step"] <= 1.5 * 12.8


def test_one_mistake_on_two_lines_is_one_finding_at_both(findings):
    """A batch's images and its labels each gathered row by row on the host: one edit (keep the set on the GPU,
    index it there) fixes both lines, so one finding names both and prices both (the fix: -2.7 ms/step, H200)."""
    found, _ = findings("host-gather")
    f = found["python_loop"]
    assert "the same at eager_mistakes.py:233" in f["evidence"], f["evidence"]
    assert f["fix"].startswith("at eager_mistakes.py:234, eager_mistakes.py:233: keep the data on the GPU"), f["fix"]
    assert 0.5 * 2.7 <= f["ms_per_step"] <= 1.5 * 2.7


def test_the_report_shows_the_host_by_line_with_each_lines_launches_idle_and_mechanism(data_summary):
    """#56 item 1: the host side by line, beside the device time the lines table has: the EMA's loop line with
    its hundreds of launches, its operators' host time, the idle that waits on it and its mechanism; the model's
    line first (the eager model launch-bound on its own); every idle gap of this eager loop on a line."""
    from profiling.profile.report.render import to_markdown
    s = data_summary("h200-eager-ema-state-dict")
    table = s["host_lines"]
    rows = {r["text"]: r for r in table["rows"]}
    ema = rows["ema_v.copy_(ema_v * decay + (1.0 - decay) * model_v)"]
    assert ema["mechanism"] == "per_parameter_loop" and ema["launches"] > 149 and ema["syncs"] == 0
    assert 0 < ema["host_ms"] < ema["idle_ms"] < table["idle_total_ms"]
    assert table["rows"][0]["text"] == "logits = self.model(self.x)" and table["rows"][0]["mechanism"] is None
    assert table["idle_ms"] == pytest.approx(table["idle_total_ms"], rel=0.01)
    md = to_markdown(s)
    assert "### The host by line" in md and "| per_parameter_loop |" in md


def test_no_line_record_no_host_by_line(data_summary):
    s = data_summary("h100-compiled-gpt-5steps")
    assert s.get("host_lines") is None


def test_a_host_tensor_names_the_intra_op_pool_where_the_capture_recorded_one(data_trace):
    """A causal mask built on the CPU in every layer (H200): where torch's intra-op pool has several threads (the
    live capture's cpu_threads, recorded on GPU runs since this trace was made), the finding says the pool
    competes with the launching thread and gives set_num_threads(1) as the stopgap; with one thread, nothing."""
    from profiling.profile.report.summary import summarize
    trace = data_trace("h200-eager-mask-on-host")
    trace["autoresearch"]["cpu_threads"] = {"intra_op": 16, "inter_op": 16, "cores": 16, "load_average": 0.5}
    f = next(f for f in summarize(trace)["findings"] if f["kind"] == "host_tensor")
    assert "intra-op pool, 16 threads here" in f["evidence"] and "torch.set_num_threads(1)" in f["fix"]
    trace = data_trace("h200-eager-mask-on-host")
    trace["autoresearch"]["cpu_threads"] = {"intra_op": 1, "inter_op": 1, "cores": 16, "load_average": 0.5}
    f = next(f for f in summarize(trace)["findings"] if f["kind"] == "host_tensor")
    assert "intra-op" not in f["evidence"] and "set_num_threads" not in f["fix"]


def test_a_block_the_line_record_step_saw_repeated_but_the_profiled_steps_did_not_launch_is_no_loop(data_summary):
    """Lightning's validation pass ran 20 batches through `logits = self.head(x)` while the line-record step was
    recorded: the block (conv2d, batch_norm, relu, pool, flatten, linear) 20 times in a row there, once a step in
    the profiled steps' launches (14 forward kernels a step, not 20 x 5). Read as a loop, it was a per-parameter
    loop (20 tensors, by coincidence) and then a Python loop to vectorize; it is neither."""
    s = data_summary("h200-uneven-eval_in_window-lightning")
    assert not [f for f in s["findings"] if f["kind"] in ("python_loop", "per_parameter_loop")], s["findings"]
    assert "launch_bound" in [f["kind"] for f in s["findings"][:2]]  # the idle is the small net's launches


def test_a_misaligned_head_is_its_shape_not_a_slow_device(data_summary):
    """HF GPT-2's 50257-word head: its three GEMMs a step ran at ~121 TFLOP/s on a healthy H200 (no clock event),
    read before as slow_device, "check the GPU before editing code"; they are misaligned_shapes' (pad to 50304)."""
    s = data_summary("h200-public-hf-gpt2-eager")
    kinds = {f["kind"]: f for f in s["findings"]}
    assert "slow_device" not in kinds
    assert "pad the vocabulary 50257 to 50304" in kinds["misaligned_shapes"]["fix"]


def test_a_launch_bound_loop_of_like_steps_is_told_cuda_graphs_priced_at_its_idle(data_summary):
    """ResNet-50 (torchvision, 16 x 224^2, eager bf16) on an H200: 940 kernels a step, the host pacing the GPU.
    Compiling in the default mode recovered nothing on this net (-2.1 to +0.3 ms/step), mode="reduce-overhead"
    18.6 -> 4.9 (compile_price_results.md): the fix leads with CUDA graphs, priced at the idle between the
    launches, which graphs remove, above conv_layout's channels_last (1.6 measured)."""
    s = data_summary("h200-public-resnet50-eager")
    top = s["findings"][0]
    assert top["kind"] == "launch_bound" and top["fix"].startswith('CUDA graphs: torch.compile the model with mode=')
    assert "CUDA graphs would replay the launches" in top["evidence"]
    idle = re.search(r"GPU idle between kernels ([\d.]+) ms/step", top["evidence"])
    assert abs(top["ms_per_step"] - float(idle.group(1))) < 0.06  # the whole idle, not compiling's ~1.0


def test_host_work_a_finding_names_keeps_cuda_graphs_out_of_launch_bound(data_summary):
    """An EMA taken through state_dict() every step (per_parameter_loop's): graphs would replay the model's launches,
    not the EMA's, which keeps pacing the step; launch_bound stays priced by compiling, the mistake first."""
    s = data_summary("h200-eager-ema-state-dict")
    assert s["findings"][0]["kind"] == "per_parameter_loop"
    bound = next(f for f in s["findings"] if f["kind"] == "launch_bound")
    assert "reduce-overhead" not in bound["fix"] and "CUDA graphs would replay" not in bound["evidence"]


def test_steps_that_differ_are_no_graphs_case():
    from profiling.profile.findings import idle

    class Tl:
        meta, labels = {}, [["gemm"], ["gemm"]]
        per_step = [[1, 2], [1, 2]]
        ix = type("Ix", (), {"runtime": [{"name": "cudaLaunchKernel"}]})()

    assert idle._graphs_fit(Tl())
    Tl.per_step = [[1, 2], [1, 2, 3]]  # another shape, another kernel set: a graph replays one
    assert not idle._graphs_fit(Tl())
    Tl.per_step, Tl.meta = [[1, 2], [1, 2]], {"steps_vary": {"steps": [1, 2]}}
    assert not idle._graphs_fit(Tl())
    Tl.meta, Tl.ix.runtime = {}, [{"name": "cudaGraphLaunch"}]  # graphs already
    assert not idle._graphs_fit(Tl())
    Tl.ix.runtime, Tl.labels = [], [["communication"], ["gemm"]]  # a collective: not measured, not claimed
    assert not idle._graphs_fit(Tl())


def test_a_hand_written_norm_run_once_per_layer_is_no_loop(data_summary):
    """HF T5 (t5-small's config, eager bf16, 8 x 128 tokens; benchmarks/findings/live/compile_price.py on an H200,
    two steps kept): its RMSNorm, `self.weight * hidden_states` after two weightless lines, runs once per layer norm,
    32 a step. Read before as a Python loop to vectorize at modeling_t5.py:65 (first, 12.6 ms/step), an edit no user
    can make; each call scales by a norm weight of its own: a stack of layers. The step is the host's launches
    (mode="reduce-overhead": 72.5 -> 10.1 ms/step): launch_bound leads with CUDA graphs."""
    s = data_summary("h200-public-hf-t5-eager")
    assert not [f for f in s["findings"] if f["kind"] in ("python_loop", "per_parameter_loop")], s["findings"][:2]
    top = s["findings"][0]
    assert top["kind"] == "launch_bound" and top["fix"].startswith("CUDA graphs: torch.compile the model")
