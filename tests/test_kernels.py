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


class _Hopper:
    """A CUDA target for Triton's front end: all that torch.compile's write analysis compiles."""
    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


@pytest.mark.skipif(train.triton is None, reason="needs Triton (Linux)")
def test_compile_sees_each_kernel_write_only_its_outputs():
    """torch.compile copies every argument it believes a Triton kernel writes, before each call: a wrong
    belief costs a full copy of the tensor (issue #9: 5.7 ms per step on an H100)."""
    from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors
    from triton.runtime import driver

    B, T, H, D, V = 2, 16, 4, 128, 256
    x, dy, out = (torch.randn(B, T, H, D, dtype=torch.bfloat16) for _ in range(3))
    cos = sin = torch.randn(1, T, 1, D // 2, dtype=torch.bfloat16)
    sizes = dict(n_rows=B * T * H, H=H, T=T, HALF=D // 2, HALF_P2=D // 2, ROWS=16)
    previous = driver._active
    driver.set_active(_Hopper())
    try:
        writes = lambda kernel, **kwargs: identify_mutated_tensors(kernel, kwargs, {})  # noqa: E731
        assert writes(train._rotary_norm_fwd, x=x, cos=cos, sin=sin, y=out, **sizes) == ["y"]
        assert writes(train._rotary_norm_bwd, dy=dy, x=x, cos=cos, sin=sin, dx=out, dy_b=1, dy_t=1, dy_h=1,
                      **sizes) == ["dx"]
        assert writes(train._softcap_cross_entropy_kernel, logits=torch.randn(4, V), targets=torch.zeros(4),
                      losses=torch.empty(4), V=V, cap=15.0, WRITE_GRAD=True, BLOCK=V) == ["logits", "losses"]
    finally:
        driver._active = previous
