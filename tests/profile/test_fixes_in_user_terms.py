"""Issue #42 item 7: fixes in the user's terms. A setting that explains eager code (TORCHDYNAMO_DISABLE) is named
with where it was set; where the model is compiled, no fix says "torch.compile the model": the eager parts are
named with their own remedies; train.py is named only in a trace of train.py."""
import pytest

from profiling.profile.report.summary import summarize


def eager(s):
    return next(f for f in s["findings"] if f["kind"] in ("eager_code", "setting"))


def test_torchdynamo_disable_is_named_as_the_cause_with_where_it_was_set(data_trace):
    trace = data_trace("h100-plant33-eager_model")
    record = trace["autoresearch"]["settings"]
    record["values"]["env.TORCHDYNAMO_DISABLE"] = "1"
    record["sources"]["env.TORCHDYNAMO_DISABLE"] = "environment"
    f = eager(summarize(trace))
    assert f["kind"] == "setting"
    assert f["evidence"].startswith("TORCHDYNAMO_DISABLE=1 (user, in the environment): it turns torch.compile off")
    assert f["fix"].startswith("unset TORCHDYNAMO_DISABLE") and "torch.compile the model" not in f["fix"]
    assert f["ms_per_step"] > 150


def test_a_compiled_model_is_never_told_to_compile(data_trace):
    """Lightning's compiled GPT-2 (the API's callback): its eager kernels are the loss, outside the compiled
    module, and the optimizer; the model itself is compiled."""
    f = eager(summarize(data_trace("h100-lightning-compiled-callback")))
    assert "the model is compiled" in f["evidence"]
    assert "torch.compile the model" not in f["fix"] and "train.py" not in f["fix"]
    assert f["fix"].startswith("the loss computed outside the compiled model")


def test_an_eager_optimizer_beside_a_compiled_model_gets_its_own_remedy(data_trace):
    f = eager(summarize(data_trace("h100-plant26-eager_optimizer")))
    assert f["fix"].startswith("the optimizer's update: fused=True") and "torch.compile the model" not in f["fix"]


@pytest.mark.parametrize("trainer, named", [("train.py", True), ("mytrain.py", False)])
def test_an_eager_model_is_told_to_compile_naming_train_py_only_in_its_own_trace(data_trace, trainer, named):
    trace = data_trace("h100-plant26-eager_model")
    trace["autoresearch"].pop("micro_batches", None)
    trace["autoresearch"]["trainer"] = trainer
    f = eager(summarize(trace))
    assert f["fix"].startswith("torch.compile the model")
    assert ("as train.py does by default" in f["fix"]) is named
    assert "TORCHDYNAMO_DISABLE" in f["evidence"]  # no settings record: the setting that would also explain it


def test_a_scatter_the_compiler_inserted_is_placed_at_the_embeddings_line(data_trace):
    """Deterministic algorithms put ATen's sorted scatter-add (aten::index_put_) inside the compiled backward: no
    node of the graph records it, it was "no line of the model" (74 ms); it is the backward of the embedding."""
    s = summarize(data_trace("h100-plant33-deterministic"))
    row = next(r for r in s["lines"]["rows"] if any("self.wte(idx)" in line["text"] for line in r["lines"]))
    assert row["ms_per_step"] > 70 and len(row["lines"]) <= 2
    assert not any("index_put" in str(u) for u in s["lines"]["unplaced"])
    setting = next(f for f in s["findings"] if f["kind"] == "setting")
    assert "the backward of the model's embedding lookups" in setting["evidence"]


@pytest.mark.parametrize("name", ["hta-v100-trace-diff-test", "hta-a100-nccl", "kineto-v100-resnet50-train"])
def test_a_foreign_report_never_names_this_projects_train_py(name):
    import os

    from profiling.profile.report.summary import load_trace
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "foreign")
    s = summarize(load_trace(os.path.join(data, f"{name}.json.gz")))
    assert s["findings"]
    assert not [f["kind"] for f in s["findings"] if "train.py" in f["fix"] + f["evidence"]]


def test_a_trainers_settings_are_named_only_where_its_loop_ran():
    """Issue #57 item 4: a GPT-2 of transformers trained in a plain loop has transformers' model frames in its host
    samples, not its Trainer's: its input-pipeline fix names the DataLoader, not TrainingArguments."""
    from types import SimpleNamespace

    from profiling.profile.findings.contract import framework as _framework
    model = ["train_job.py:40 main", "transformers/models/gpt2/modeling_gpt2.py:603 forward"]
    trainer = ["transformers/trainer.py:1576 train", "transformers/trainer.py:2480 _inner_training_loop"]
    lightning = ["lightning/pytorch/loops/fit_loop.py:205 run", "train_job.py:12 training_step"]

    def tl(*stacks, framework=None):
        return SimpleNamespace(meta={"framework": framework, "host_samples": {"stacks": list(stacks)}})
    assert _framework(tl(model)) is None
    assert _framework(tl(model, trainer)) == "transformers"
    assert _framework(tl(model, framework="transformers 5.17.0")) == "transformers"  # the callback's record
    assert _framework(tl(lightning)) == "lightning"


def test_a_cpu_report_never_says_train_py_compiles_there(data_trace):
    """train.py compiles on CUDA only, and compiling measured slower on every CPU loop timed (issue #56): its CPU
    report names the eager chains unpriced, with no fix saying to compile nor "as train.py does by default"."""
    trace = data_trace("cpu-gpt-2steps")
    trace["autoresearch"]["trainer"] = "train.py"
    s = summarize(trace)
    assert not any("torch.compile" in f["fix"] or "train.py" in f["fix"] for f in s["findings"]), s["findings"]
    (u,) = [u for u in s["unknown"] if u["rule"] == "eager_code"]
    assert "train.py" not in u["what"] and "time the compiled step" in u["what"], u["what"]


def test_a_module_compile_that_compiled_nothing_is_named_where_compiling_is_the_fix(data_trace):
    """An eager H200 loop (launch_bound first) whose nn.Sequential had Module.compile() called on it: no compiled
    graph ran, so the remedy says why and what compiles it; without the record, or with graphs, it says nothing."""
    trace = data_trace("h200-eager-ema-state-dict")
    trace["autoresearch"]["compile_ignored"] = ["the model (Sequential)"]
    found = {f["kind"]: f for f in summarize(trace)["findings"]}
    for kind in ("launch_bound", "eager_code"):
        assert "Module.compile() was called on the model (Sequential), yet nothing ran compiled" in found[kind]["fix"]
        assert "model = torch.compile(model)" in found[kind]["fix"]
    plain = {f["kind"]: f for f in summarize(data_trace("h200-eager-ema-state-dict"))["findings"]}
    assert "Module.compile()" not in plain["launch_bound"]["fix"]
