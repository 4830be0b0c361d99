"""train.py's Triton kernels (the fused head and loss, rotary + RMSNorm) agree with their float64
definitions: on CPU through Triton's interpreter, on CUDA eager and compiled as train.py runs them."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from tests.kernel_check import check_head_loss, check_rotary_norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(train.triton is None, reason="needs Triton (Linux)")
def test_kernels_match_their_definitions_in_the_interpreter():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "kernel_check.py")], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": ROOT},
                         timeout=300, check=True)
    errors = json.loads(out.stdout)
    for shape, e in errors.items():
        if shape.startswith("rotary"):
            assert e["y"] < 1e-2 and e["dx"] < 1e-2, shape  # relative to the largest: bf16 rounding (2^-9)
            continue
        assert e["loss"] < 1e-4, shape  # float32 arithmetic on exact inputs
        assert e["grad"] < 1e-2, shape  # the gradient is rounded to the logits' dtype (bf16: 2^-9)
        assert e["ignored_loss"] == 0 and e["ignored_grad"] == 0, shape


def test_cpu_loss_is_the_definition():
    torch.manual_seed(0)
    x, w, targets = torch.randn(10, 8), torch.randn(50, 8) * 5, torch.randint(0, 50, (10,))
    targets[3] = -1
    expected = torch.nn.functional.cross_entropy(15 * torch.tanh(x @ w.t() / 15), targets, ignore_index=-1,
                                                 reduction="none")
    assert torch.allclose(train.head_loss(x, w, targets, "none"), expected)
    assert torch.allclose(train.head_loss(x, w, targets), expected.sum() / 9)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_kernels_match_their_definitions_on_cuda(compiled):
    for shape, e in check_head_loss(compiled).items():
        assert e["loss"] < 1e-2, shape  # bf16 logits, as the reference under autocast
        assert e["dx"] < 3e-2 and e["dw"] < 3e-2, shape
        assert e["ignored_loss"] == 0, shape
    for shape, e in check_rotary_norm("cuda", compiled).items():
        assert e["y"] < 1e-2 and e["dx"] < 1e-2, shape
