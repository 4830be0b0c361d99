"""profiling.profile.trace.settings: the process's settings, recorded before the profiled steps, and who set them."""
import json
import os
import subprocess
import sys

import pytest

from profiling.profile.report.render import to_json, to_markdown
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.capture import settings as capture_settings
from profiling.profile.trace import settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = os.path.join(ROOT, "tests", "data", "h100-compiled-gpt-5steps.trace.json.gz")
TRAIN_PY = {"float32_matmul_precision": "high", "gc.enabled": False, "gc.frozen": True}  # runner's, on CUDA

# One process for every live check (global modes must not leak into other tests): a snapshot of a fresh
# process, then one after the kinds of edits a researcher makes, with the profiler's own changes added.
SCRIPT = """
import gc, json, os, sys
import torch
from profiling.profile.capture import settings
default = settings.snapshot()
compiler_loaded = [m for m in ("torch._dynamo", "torch._inductor.config") if m in sys.modules]
torch.use_deterministic_algorithms(True)
torch.autograd.set_detect_anomaly(True)
torch.backends.cudnn.benchmark = True
import torch._inductor.config
torch._inductor.config.max_fusion_size = 32
os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
torch.set_float32_matmul_precision("high")
gc.collect(); gc.freeze(); gc.disable()
from profiling.profile.capture import provenance, window
provenance.start()
planted = settings.snapshot(train_py=json.loads(sys.argv[1]))
planted["profiler"] = window.own_settings(planted, cuda=True)
print(json.dumps({"default": default, "planted": planted, "compiler_loaded": compiler_loaded}))
"""


@pytest.fixture(scope="module")
def live():
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(capture_settings.ENV_PREFIXES) or k in capture_settings.ENV_NAMES)}
    env.update(CUBLAS_WORKSPACE_CONFIG=":4096:8", CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT,
               AUTORESEARCH_PROVENANCE="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(TRAIN_PY)], env=env, cwd=ROOT, check=False,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def by_name(rows):
    return {r["name"]: r for r in rows}


def test_a_fresh_process_lists_only_its_environment(live):
    record = live["default"]
    assert record["notes"] == [] and live["compiler_loaded"] == []  # recording never imports the compiler
    rows = settings.differing(record)
    assert [(r["name"], r["by"], r["source"]) for r in rows] == [("env.CUBLAS_WORKSPACE_CONFIG", "user",
                                                                 "environment")]
    assert record["values"]["env.CUDA_VISIBLE_DEVICES"] == ""  # recorded, but which GPU is no setting
    assert settings.value(record, "deterministic_algorithms") is False
    assert json.loads(json.dumps(record)) == record


def test_each_planted_setting_is_listed_with_who_set_it(live):
    rows = by_name(settings.differing(live["planted"]))
    user = {name: (r["value"], r["default"]) for name, r in rows.items() if r["by"] == "user"}
    assert user == {"deterministic_algorithms": (True, False), "anomaly_mode": (True, False),
                    "cudnn.benchmark": (True, False), "inductor.max_fusion_size": (32, 64),
                    "env.CUBLAS_WORKSPACE_CONFIG": (":4096:8", None),
                    "env.PYTORCH_NO_CUDA_MEMORY_CACHING": ("1", None)}
    assert rows["env.CUBLAS_WORKSPACE_CONFIG"]["source"] == "environment"
    assert rows["env.PYTORCH_NO_CUDA_MEMORY_CACHING"]["source"] == "process"  # os.environ in train.py
    assert {n for n, r in rows.items() if r["by"] == "train.py"} == {"float32_matmul_precision", "gc.enabled",
                                                                     "gc.frozen"}
    # views of a listed setting are not listed again: cuBLAS TF32 (precision high), inductor.deterministic
    assert "cuda.matmul.allow_tf32" not in rows and "inductor.deterministic" not in rows
    profiler = {n: r["during"] for n, r in rows.items() if r["by"] == "profiler"}
    assert profiler == {"inductor.trace.provenance_tracking_level": "compile", "compiler.cache_key_tag": "compile",
                        "inductor.cpp.enable_kernel_profile": "compile", "sync_debug_mode": "shape step"}
    assert rows["sync_debug_mode"]["value"] == "warn"
    assert settings.value(live["planted"], "inductor.trace.provenance_tracking_level") == 0  # the user's


def test_header_line_of_a_live_record(live):
    line = settings.text(settings.summary(live["planted"]))
    assert line.startswith("Process settings that differ from torch's defaults (before the profiled steps; who set "
                           "each): deterministic algorithms on, autograd anomaly mode on, cuDNN benchmark on, "
                           "inductor.max_fusion_size=32 (user) · CUBLAS_WORKSPACE_CONFIG=:4096:8 (user, "
                           "environment) · PYTORCH_NO_CUDA_MEMORY_CACHING=1 (user, set in the process) · "
                           "float32 matmul precision high, gc disabled and frozen (train.py) · ")
    assert "inductor provenance tracking 1" in line and "(profiler, at compile)" in line
    assert line.endswith("sync debug mode warn (profiler, during the untimed step after the profiled steps only)")


def record(values, defaults=None, **extra):
    return dict({"version": 1, "values": values, "defaults": defaults or {}, "sources": {}, "launcher": None,
                 "notes": []}, **extra)


def test_train_py_choice_changed_is_the_users():
    r = record({"float32_matmul_precision": "medium", "gc.enabled": False},
               {"float32_matmul_precision": "highest", "gc.enabled": True}, **{"train.py": TRAIN_PY})
    assert [(x["name"], x["by"]) for x in settings.differing(r)] == [("float32_matmul_precision", "user"),
                                                                     ("gc.enabled", "train.py")]


def test_a_changed_gc_threshold_is_listed():
    """gc.threshold is a list (the record is JSON): a user who tunes the collector gets it in the header line
    (it once raised `unhashable type: 'list'` there, losing the report)."""
    r = record({"gc.threshold": [20000, 10, 10], "gc.enabled": False}, {"gc.threshold": [700, 10, 10],
                                                                        "gc.enabled": True})
    assert settings.text(settings.summary(r)) == ("Process settings that differ from torch's defaults (before the "
                                                  "profiled steps; who set each): gc threshold 20000,10,10 and "
                                                  "disabled (user)")


def test_views_disagreeing_with_their_setting_are_listed():
    r = record({"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": True},
               {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False})
    assert [x["name"] for x in settings.differing(r)] == ["cuda.matmul.allow_tf32"]


def test_environment_neutral_and_torchrun_variables():
    r = record({"env.CUDA_VISIBLE_DEVICES": "3", "env.CUDA_HOME": "/usr/local/cuda", "env.NCCL_VERSION": "2.21",
                "env.OMP_NUM_THREADS": "1", "env.CUDA_LAUNCH_BLOCKING": "1"}, launcher="torchrun")
    rows = settings.differing(r)
    assert [(x["name"], x["by"]) for x in rows] == [("env.OMP_NUM_THREADS", "torchrun"),
                                                    ("env.CUDA_LAUNCH_BLOCKING", "user")]
    assert settings.text(settings.summary(r)).endswith(
        "CUDA_LAUNCH_BLOCKING=1 (user, environment) · OMP_NUM_THREADS=1 (torchrun, environment)")


def test_a_profiler_setting_the_user_had_already_is_the_users():
    r = record({"inductor.trace.provenance_tracking_level": 1}, {"inductor.trace.provenance_tracking_level": 0},
               profiler={"inductor.trace.provenance_tracking_level": {"value": 1, "before": 1, "during": "compile"}})
    assert [(x["name"], x["by"]) for x in settings.differing(r)] == [("inductor.trace.provenance_tracking_level",
                                                                     "user")]
    assert settings.value(r, "inductor.trace.provenance_tracking_level") == 1


def test_a_setting_the_profiler_overrides_keeps_the_users_value():
    r = record({"sync_debug_mode": "error"}, {"sync_debug_mode": "default"},
               profiler={"sync_debug_mode": {"value": "warn", "before": "error", "during": "profiled steps"}})
    assert [(x["value"], x["by"]) for x in settings.differing(r)] == [("error", "user"), ("warn", "profiler")]
    assert settings.value(r, "sync_debug_mode") == "error"


def test_no_record_and_foreign_input():
    for bad in (None, {}, [], {"values": "?"}):
        assert settings.differing(bad) == [] and settings.summary(bad) == {"recorded": False}
        assert settings.value(bad, "deterministic_algorithms", "?") == "?"
    assert settings.text(None) is None  # a summary.json from before settings existed: no line
    assert settings.text({"recorded": False}).startswith("Process settings: not recorded in this trace")
    assert settings.text(settings.summary(record({"gc.enabled": True}, {"gc.enabled": True}))) == \
        "Process settings: all at torch's defaults (modes, backends flags, compiler, environment, gc)"


def test_a_long_list_is_cut():
    values = {f"env.NCCL_X{i:02d}": "1" for i in range(30)}
    r = record(values, sources={n: "process" if i % 2 else "environment" for i, n in enumerate(values)})
    line = settings.text(settings.summary(r))
    assert line.count("NCCL_X") == settings.MAX_SHOWN
    assert line.endswith(f"(user, set in the process) · +{30 - settings.MAX_SHOWN} more in summary.json `settings`")


@pytest.fixture(scope="module")
def old_trace():
    return load_trace(H100)


def test_report_and_json_of_an_old_trace(old_trace):
    s = summarize(old_trace)
    assert s["settings"] == {"recorded": False}
    md = to_markdown(s).splitlines()
    assert md[2].startswith("Process settings: not recorded in this trace") and md[3].startswith("Recorded by torch.profiler ")
    assert md[4] == ""
    assert json.loads(to_json(s))["settings"] == {"recorded": False}


def test_report_and_json_of_a_recorded_trace(old_trace):
    trace = dict(old_trace, autoresearch={"settings": record(
        {"deterministic_algorithms": True, "env.CUDA_LAUNCH_BLOCKING": "1"}, {"deterministic_algorithms": False},
        sources={"env.CUDA_LAUNCH_BLOCKING": "environment"})})
    s = summarize(trace)
    assert [r["name"] for r in s["settings"]["differs"]] == ["deterministic_algorithms", "env.CUDA_LAUNCH_BLOCKING"]
    assert json.loads(to_json(s))["settings"]["all"]["values"]["env.CUDA_LAUNCH_BLOCKING"] == "1"
    assert to_markdown(s).splitlines()[2] == ("Process settings that differ from torch's defaults (before the profiled "
                                              "steps; who set each): deterministic algorithms on (user) · "
                                              "CUDA_LAUNCH_BLOCKING=1 (user, environment)")
