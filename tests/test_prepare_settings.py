"""Constants: presets, environment overrides, bad values."""
import json
import os
import subprocess
import sys

import pytest

import prepare
from prepare import PrepareError, resolve_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def no_cuda():
    return False


def cuda_must_not_be_asked():
    raise AssertionError("the preset was given; CUDA should not be queried")


def test_upstream_values_are_the_full_preset():
    s = resolve_settings({"AUTORESEARCH_PRESET": "full"}, cuda_must_not_be_asked)
    assert s == {"preset": "full", "MAX_SEQ_LEN": 2048, "TIME_BUDGET": 300, "EVAL_TOKENS": 40 * 524288,
                 "VOCAB_SIZE": 8192}


def test_cpu_preset_values():
    s = resolve_settings({"AUTORESEARCH_PRESET": "cpu"}, cuda_must_not_be_asked)
    assert s == {"preset": "cpu", "MAX_SEQ_LEN": 256, "TIME_BUDGET": 60, "EVAL_TOKENS": 131072,
                 "VOCAB_SIZE": 8192}


def test_default_preset_follows_cuda():
    assert resolve_settings({}, lambda: True)["preset"] == "full"
    assert resolve_settings({}, no_cuda)["preset"] == "cpu"


def test_overrides_each_constant():
    env = {"AUTORESEARCH_PRESET": "full", "AUTORESEARCH_MAX_SEQ_LEN": "64", "AUTORESEARCH_TIME_BUDGET": "2.5",
           "AUTORESEARCH_EVAL_TOKENS": "4096", "AUTORESEARCH_VOCAB_SIZE": "300"}
    s = resolve_settings(env, no_cuda)
    assert s == {"preset": "full", "MAX_SEQ_LEN": 64, "TIME_BUDGET": 2.5, "EVAL_TOKENS": 4096,
                 "VOCAB_SIZE": 300}
    assert isinstance(resolve_settings({"AUTORESEARCH_TIME_BUDGET": "30"}, no_cuda)["TIME_BUDGET"], int)


@pytest.mark.parametrize("var,value", [
    ("AUTORESEARCH_MAX_SEQ_LEN", "0"), ("AUTORESEARCH_MAX_SEQ_LEN", "-5"),
    ("AUTORESEARCH_MAX_SEQ_LEN", "2.5"),
    ("AUTORESEARCH_EVAL_TOKENS", "lots"), ("AUTORESEARCH_VOCAB_SIZE", ""), ("AUTORESEARCH_VOCAB_SIZE", "100"),
    ("AUTORESEARCH_TIME_BUDGET", "nan"), ("AUTORESEARCH_TIME_BUDGET", "-1"), ("AUTORESEARCH_PRESET", "gpu"),
])
def test_bad_values_name_the_variable(var, value):
    with pytest.raises(PrepareError) as e:
        resolve_settings({var: value}, no_cuda)
    assert var in str(e.value) and "\n" not in str(e.value)


def test_settings_reports_the_module_constants():
    assert prepare.settings() == {"preset": prepare.PRESET, "MAX_SEQ_LEN": prepare.MAX_SEQ_LEN,
                                  "TIME_BUDGET": prepare.TIME_BUDGET, "EVAL_TOKENS": prepare.EVAL_TOKENS,
                                  "VOCAB_SIZE": prepare.VOCAB_SIZE}
    assert prepare.PRESET == os.environ["AUTORESEARCH_PRESET"]  # conftest picks cpu unless told otherwise


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, check=False)


def test_environment_reaches_the_module_at_import():
    r = run_python("import json, prepare; print(json.dumps(prepare.settings()))",
                   AUTORESEARCH_PRESET="full", AUTORESEARCH_MAX_SEQ_LEN="128")
    assert r.returncode == 0, r.stderr
    vocab = int(os.environ["AUTORESEARCH_VOCAB_SIZE"])
    assert json.loads(r.stdout) == {"preset": "full", "MAX_SEQ_LEN": 128, "TIME_BUDGET": 300,
                                    "EVAL_TOKENS": 40 * 524288, "VOCAB_SIZE": vocab}


def test_cli_bad_environment_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "prepare.py", "--dataset", "builtin"], cwd=ROOT, capture_output=True,
                       text=True, check=False, env={**os.environ, "AUTORESEARCH_VOCAB_SIZE": "big",
                                       "AUTORESEARCH_CACHE": str(tmp_path)})
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "AUTORESEARCH_VOCAB_SIZE" in r.stderr
    assert os.listdir(tmp_path) == []
