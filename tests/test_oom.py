"""profiling/profile/report/oom.py: an out-of-memory error read and explained, from torch's own message (pure, no GPU)."""
import json

import pytest

from profiling import runfile
from profiling.profile.report import oom

H100 = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB "
        "is free. Including non-PyTorch memory, this process has 77.68 GiB memory in use. Of the allocated memory "
        "75.60 GiB is allocated by PyTorch, and 1.58 GiB is reserved by PyTorch but unallocated.")


def test_the_figures_of_torchs_message_in_mb():
    f = oom.parse(H100)
    assert f == {"requested_mb": 2048.0, "device_mb": 81090.6, "free_mb": 1536.0, "process_mb": 79544.3,
                 "cap_mb": None, "allocated_mb": 77414.4, "reserved_unallocated_mb": 1617.9}
    capped = oom.parse("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 79.19 GiB "
                       "of which 40.00 GiB is free. 38.00 GiB allowed; Of the allocated memory 37.50 GiB is "
                       "allocated by PyTorch, and 100.00 KiB is reserved by PyTorch but unallocated.")
    assert capped["cap_mb"] == 38912.0 and capped["requested_mb"] == 512.0
    assert capped["reserved_unallocated_mb"] == 0.1 and capped["process_mb"] is None


def test_what_fits_is_an_upper_bound_from_the_failure():
    """The issue's H100 run: micro-batch 256 fails; 208 was measured to fit and 224 not. From the failure alone
    (here 6,400 MB of weights, gradients and optimizer state) the estimate can only bound it from above."""
    info = oom.explain(H100, micro_batch=256, fixed_mb=6400.0, where="train.py:402 loss.backward()")
    assert info["limit"] == "device" and info["limit_mb"] == 81090.6
    assert info["outside_mb"] == 512.0   # in use by the process, neither allocated nor reserved: the context
    assert info["per_sequence_mb"] == round((77414.4 + 1617.9 + 2048 - 6400) / 256, 1)
    assert info["max_micro_batch"] == 254 and info["recommended_micro_batch"] == 224  # 254 x 0.9 = 228, a multiple of 8
    assert info["recommended_micro_batch"] <= 0.9 * info["max_micro_batch"]
    text = oom.message(info, knob="DEVICE_BATCH_SIZE")
    assert text.startswith("CUDA out of memory at DEVICE_BATCH_SIZE=256: hit the device's memory, 81,091 MB, "
                           "allocating 2,048 MB at train.py:402 loss.backward()")
    assert f"at most {info['max_micro_batch']} sequences per micro-batch can fit (an upper bound" in text
    assert f"try DEVICE_BATCH_SIZE={info['recommended_micro_batch']} (10% margin)" in text


def test_a_cap_the_process_set_is_the_limit_named():
    info = oom.explain(H100, micro_batch=64, fixed_mb=6400.0, cap_mb=40000.0)
    assert info["limit"] == "cap" and info["limit_mb"] == 40000.0
    assert "hit the process's memory cap (torch.cuda.set_per_process_memory_fraction), 40,000 MB" in oom.message(info)


def test_without_the_figures_it_says_so_and_guesses_nothing():
    info = oom.explain("CUDA out of memory. Tried to allocate 8.00 GiB", micro_batch=128)
    assert info["max_micro_batch"] is None and info["limit"] is None
    text = oom.message(info, knob="DEVICE_BATCH_SIZE")
    assert "hit an unknown limit, ?" in text and text.endswith(
        "lower DEVICE_BATCH_SIZE (the figures to estimate what fits are missing)")


def test_a_model_too_big_for_one_sequence():
    info = oom.explain(H100, micro_batch=1, fixed_mb=81000.0)
    assert info["max_micro_batch"] is None  # no room at all beside the weights: nothing to estimate from
    info = oom.explain(H100, micro_batch=1, fixed_mb=60000.0)  # one sequence failed: none fits
    assert info["max_micro_batch"] == 0 and info["recommended_micro_batch"] == 0
    assert oom.message(info).endswith("even one sequence needs about 21,080 MB beside 60,000 MB of weights and "
                                      "optimizer state: make the model smaller")


def test_run_json_keeps_it_and_older_run_files_still_read(tmp_path):
    info = oom.explain(H100, micro_batch=256, fixed_mb=6400.0)
    run = runfile.make_run("crash", {}, {}, "builtin", error=oom.message(info), oom=info)
    runfile.write_run(tmp_path / "run.json", run)
    assert runfile.read_run(tmp_path / "run.json")["oom"] == info
    old = dict(run)
    del old["oom"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert "oom" not in runfile.read_run(tmp_path / "old.json")
    assert runfile.validate_run(dict(run, oom="lots")) == ["oom is not an object or null"]


FITS = {"max_micro_batch": 215, "recommended_micro_batch": 192, "margin_percent": 10, "per_sequence_mb": 345.0}


def test_the_last_profile_of_this_model_is_named_first():
    info = oom.explain(H100, micro_batch=256, fixed_mb=6400.0, profiled={"folder": "profiles/latest", "fits": FITS})
    text = oom.message(info, knob="DEVICE_BATCH_SIZE")
    assert ("the last profile of this model (profiles/latest) predicts at most 215 fit: try DEVICE_BATCH_SIZE=192 "
            "(10% margin); from this failure, at most 254 sequences per micro-batch can fit") in text
    assert text.count("try DEVICE_BATCH_SIZE") == 1


def test_a_profile_counts_only_when_it_measured_this_model(tmp_path, monkeypatch):
    """The runner's lookup: profiles/latest's memory record, when its parameters' MB are this model's."""
    runner = pytest.importorskip("profiling.runner")  # the trainer's runner (torch, prepare.py)
    latest = tmp_path / "latest"
    latest.mkdir()
    (latest / "summary.json").write_text(json.dumps({"gpu_memory": {"categories": {"parameters": 1000.0},
                                                                      "fits": FITS}}))
    monkeypatch.setenv("AUTORESEARCH_PROFILE_DIR", str(tmp_path))
    assert runner._profiled_fits(1005.0) == {"folder": str(latest), "fits": FITS}
    assert runner._profiled_fits(1200.0) is None   # another model (a new DEPTH): its figures do not carry over
    assert runner._profiled_fits(0.0) is None      # nothing on the GPU to compare


def test_the_line_named_is_the_users_not_a_compiled_graphs_generated_code():
    """The H100 run at micro-batch 219 failed inside Inductor's generated code (a file in its cache folder): the
    message names the compiled graph and the user's line that called it, never the generated file's line."""
    torch_frame = ("/opt/venv/lib/python3.12/site-packages/torch/_inductor/output_code.py", 656, "return f(x)")
    frames = [("train.py", 529, "sys.exit(main())"), ("train.py", 389, "loss = train_step(step, progress)"),
              torch_frame, ("/tmp/torchinductor_root/qc/cqcrpu7.py", 2819, "buf258 = empty_strided_cuda(...)")]
    assert oom.user_line(frames) == ("a compiled graph (Inductor's generated code), called from train.py:389 "
                                     "loss = train_step(step, progress)")
    assert oom.user_line(frames[:2]) == "train.py:389 loss = train_step(step, progress)"
    assert oom.user_line([torch_frame]) is None
    assert oom.user_line([frames[-1]]) == "a compiled graph (Inductor's generated code)"


def test_generated_code_is_known_wherever_the_compile_cache_is():
    """The H100 run of #43 set TORCHINDUCTOR_CACHE_DIR=.bench/memory_advice/inductor: its OOM and memory lines
    named `24/c24adrdp...py:2777`, a generated file's line, because only a `torchinductor` folder was known.
    Inductor's own naming (`<xy>/c<xy...>.py`) tells it anywhere."""
    from profiling.profile.trace import allocator
    moved = ".bench/memory_advice/inductor/24/c24adrdp7tvvi2kxnxpw6giby7gwswcjpmyx7asr47af75tobppv.py"
    frames = [("train.py", 389, "loss = train_step(step, progress)"), (moved, 2781, "buf251 = empty_strided_cuda(...)")]
    assert oom.user_line(frames).endswith("called from train.py:389 loss = train_step(step, progress)")
    snapshot_frames = [{"filename": moved, "line": 2781, "name": "call"},
                       {"filename": "/w/train.py", "line": 389, "name": "main"}]
    assert allocator.innermost_own(snapshot_frames) == "w/train.py:389 (compiled graph)"
    assert not allocator.generated("/w/24/c25notthesamefolder0000000000000.py")
    assert not allocator.generated("/w/ab/cab.py")  # a user's short file named like one


# ---------------------------------------------------------------------------------------------------------
# #43: a micro-batch train.py accepts; a failure at a micro-batch that fit before says what grew
# ---------------------------------------------------------------------------------------------------------

def test_the_recommendation_divides_the_sequences_per_step():
    """The issue's line said "try 112" at 256 sequences a step: train.py exits 2 on it. With the step known,
    the failure's own estimate (254) and a profile's (215) both give 128 with 2 micro-batches a step, from
    one function (gpu_memory.advice), so they agree."""
    info = oom.explain(H100, micro_batch=256, fixed_mb=6400.0, sequences=256)
    assert (info["max_micro_batch"], info["recommended_micro_batch"], info["grad_accum_steps"]) == (254, 128, 2)
    text = oom.message(info, knob="DEVICE_BATCH_SIZE")
    assert ("try DEVICE_BATCH_SIZE=128 (gradient accumulation 2 for the 256 sequences per step, 10% margin)"
            in text)
    profiled = oom.explain(H100, micro_batch=256, fixed_mb=6400.0, sequences=256,
                           profiled={"folder": "profiles/latest", "fits": FITS})
    assert profiled["profiled"]["fits"]["recommended_micro_batch"] == 128 == profiled["recommended_micro_batch"]
    assert "predicts at most 215 fit: try DEVICE_BATCH_SIZE=128 (gradient accumulation 2" in oom.message(
        profiled, knob="DEVICE_BATCH_SIZE")
    for sequences in (96, 256, 384, 1000):
        b = oom.explain(H100, micro_batch=256, fixed_mb=6400.0, sequences=sequences)["recommended_micro_batch"]
        assert sequences % b == 0


def test_a_profile_that_predicted_this_micro_batch_fits_is_not_repeated():
    """The profile said 215 fit; 256 failed, so not its prediction: the failure's own estimate is the advice."""
    info = oom.explain(H100, micro_batch=200, fixed_mb=6400.0, sequences=400,
                       profiled={"folder": "profiles/latest", "fits": FITS})
    assert info["profiled"] is None and "the last profile" not in oom.message(info)


KEPT = {"gpu_memory": {  # the H100's default config (tests/data/h100-memory-b128.trace.json.gz), as summary.json
    "peak_allocated_mb": 44990.698, "micro_batch": 128,
    "categories": {"parameters": 152.002, "gradients": 152.002, "optimizer_state": 208.192,
                   "activations": 40310.502, "other_persistent": 64.0, "temporaries": 4104.0},
    "lines": [{"where": "b128/train.py:122 (compiled graph)", "mb": 18540.0},
              {"where": "b128/train.py:76 (compiled graph)", "mb": 5904.0}]}}
# the run that kept each micro-batch's graph alive failed at the same micro-batch, holding ~76 GB
DOUBLED = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
           "1.50 GiB is free. Including non-PyTorch memory, this process has 77.68 GiB memory in use. Of the "
           "allocated memory 74.50 GiB is allocated by PyTorch, and 2.40 GiB is reserved by PyTorch but unallocated.")
NOW = {"categories": {"parameters": 152.0, "gradients": 152.0, "optimizer_state": 0.0},
       "lines": [{"where": "edit/train.py:122 (compiled graph)", "mb": 37080.0},
                 {"where": "edit/train.py:76 (compiled graph)", "mb": 11808.0},
                 {"where": "edit/train.py:300", "mb": 10.0}]}


def test_a_failure_at_a_micro_batch_a_kept_run_fit_says_what_grew():
    before = oom.kept_fit([("the kept run, experiment 1 (ac9b83f)", "profiles/a", KEPT)], 128, 152.0)
    assert before["peak_mb"] == 44990.698 and before["micro_batch"] == 128
    info = oom.explain(DOUBLED, micro_batch=128, fixed_mb=304.0, sequences=256, before=before, now=NOW,
                       profiled={"folder": "profiles/latest", "fits": dict(FITS, max_micro_batch=211)})
    f = info["fitted"]
    assert (f["held_mb"], f["requested_mb"]) == (76288.0, 2048.0)
    assert f["growth_mb"] == round(76288.0 + 2048.0 - 44990.698, 1)
    rest = f["categories"][0]
    assert rest["name"] == "activations, temporaries and buffers" and rest["before_mb"] == 44478.5
    assert rest["now_mb"] == 76288.0 - 304.0 + 2048.0 and rest["change_mb"] > 33000
    assert {c["name"]: c["change_mb"] for c in f["categories"]}["optimizer_state"] == -208.2
    assert [r["where"] for r in f["lines"]][:2] == ["edit/train.py:122 (compiled graph)",
                                                    "edit/train.py:76 (compiled graph)"]
    assert f["lines"][0]["change_mb"] == 18540.0 and f["lines_missing"] is None
    assert info["profiled"] is None   # it predicted 211 fit: this run's memory is not that profile's any more
    text = oom.message(info, knob="DEVICE_BATCH_SIZE")
    assert ("the kept run, experiment 1 (ac9b83f) fit DEVICE_BATCH_SIZE=128 with a peak of 44,991 MB allocated; "
            "this run held 76,288 MB and asked for 2,048 MB more (+33,345 MB): activations, temporaries and "
            "buffers +33,554 MB, optimizer state -208 MB; grew most at `edit/train.py:122 (compiled graph)` "
            "+18,540 MB (37,080 MB now), `edit/train.py:76 (compiled graph)` +5,904 MB (11,808 MB now)") in text
    assert "try DEVICE_BATCH_SIZE=64" in text   # the failure's own estimate, a divisor of 256
    blind = oom.explain(DOUBLED, micro_batch=128, fixed_mb=304.0, before=before, now=dict(NOW, lines=None))
    assert blind["fitted"]["lines"] is None
    assert "run again with AUTORESEARCH_MEMORY_HISTORY=1 for the lines holding it" in oom.message(blind)


def test_only_a_run_of_this_model_at_this_micro_batch_counts():
    older = {"gpu_memory": dict(KEPT["gpu_memory"], micro_batch=None, fits={
        "basis": "measured at micro-batch 128; memory outside PyTorch measured"})}  # before #43: in the basis
    assert oom.measured_at(older["gpu_memory"]) == 128 and oom.measured_at({}) is None
    at64 = {"gpu_memory": dict(KEPT["gpu_memory"], micro_batch=64)}
    chosen = oom.kept_fit([("a", "f/a", at64), ("b", "f/b", None), ("c", "f/c", older)], 128, 152.0)
    assert chosen["source"] == "c"
    assert oom.kept_fit([("c", "f/c", older)], 128, 200.0) is None   # another model (a new DEPTH)
    assert oom.kept_fit([("c", "f/c", older)], 64, 152.0) is None


def test_the_crash_record_keeps_what_grew(tmp_path, monkeypatch):
    """The runner's lookup reads the kept runs' profiles (these settings and dataset), newest first, then
    profiles/latest; run.json, and the memory's record made from it, keep `fitted`."""
    runner = pytest.importorskip("profiling.runner")  # the trainer's runner (torch, prepare.py)
    kept = tmp_path / "profiles" / "kept"
    kept.mkdir(parents=True)
    (kept / "summary.json").write_text(json.dumps(KEPT))
    settings = {"MAX_SEQ_LEN": 2048, "hardware": "1x H100"}
    record = {"id": 4, "status": "keep", "commit": "ac9b83f", "profile": str(kept), "settings": settings,
              "dataset": "builtin", "device": "H100"}
    monkeypatch.setattr(runner.experiments, "load",
                        lambda path: {"experiments": [record, dict(record, id=5, profile=None)]})
    monkeypatch.setenv("AUTORESEARCH_PROFILE_DIR", str(tmp_path / "none"))
    before = oom.kept_fit(runner._fit_candidates(settings, "builtin"), 128, 152.0)
    assert before["source"] == "the kept run, experiment 4 (ac9b83f)" and before["folder"] == str(kept)
    assert oom.kept_fit(runner._fit_candidates(dict(settings, MAX_SEQ_LEN=1024), "builtin"), 128, 152.0) is None
    latest = tmp_path / "profiles" / "latest"
    latest.mkdir()
    (latest / "summary.json").write_text(json.dumps(KEPT))
    monkeypatch.setenv("AUTORESEARCH_PROFILE_DIR", str(tmp_path / "profiles"))
    assert oom.kept_fit(runner._fit_candidates({}, "builtin"), 128, 152.0)["source"] == \
        "the last profile of this model"
    info = oom.explain(DOUBLED, micro_batch=128, fixed_mb=304.0, before=before, now=NOW)
    run = runfile.make_run("crash", {}, {}, "builtin", error=oom.message(info), oom=info)
    runfile.write_run(tmp_path / "run.json", run)
    assert runfile.read_run(tmp_path / "run.json")["oom"]["fitted"] == info["fitted"]
