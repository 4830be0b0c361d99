"""profiling/profile/oom.py: an out-of-memory error read and explained, from torch's own message (pure, no GPU)."""
import json

import pytest

from profiling import runfile
from profiling.profile import oom

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
