"""kernels.py: the Triton kernels (the fused head and loss, rotary + RMSNorm) agree with their float64
definitions (on CPU through Triton's interpreter, on CUDA eager and compiled as train.py runs them); every
op's plain-PyTorch reference runs on CPU; inputs a fast path does not take fall back to the reference with
a one-line notice, never a crash (the reasons on CPU, the fallbacks themselves on CUDA)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import kernels
from tests.kernel_check import check_head_loss, check_rotary_norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(kernels.triton is None, reason="needs Triton (Linux)")
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
    assert torch.allclose(kernels.head_loss(x, w, targets, "none"), expected)
    assert torch.allclose(kernels.head_loss(x, w, targets), expected.sum() / 9)


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


@pytest.mark.skipif(kernels.triton is None, reason="needs Triton (Linux)")
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
        assert writes(kernels._rotary_norm_fwd, x=x, cos=cos, sin=sin, y=out, **sizes) == ["y"]
        assert writes(kernels._rotary_norm_bwd, dy=dy, x=x, cos=cos, sin=sin, dx=out, dy_b=1, dy_t=1, dy_h=1,
                      **sizes) == ["dx"]
        assert writes(kernels._softcap_cross_entropy_kernel, logits=torch.randn(4, V), targets=torch.zeros(4),
                      losses=torch.empty(4), V=V, cap=15.0, WRITE_GRAD=True, BLOCK=V) == ["logits", "losses"]
    finally:
        driver._active = previous


# ---------------------------------------------------------------------------
# The references, and the fallbacks
# ---------------------------------------------------------------------------

def loop_attention(q, k, v, window):
    """Causal attention over the last `window` keys, mask built by loops, in float64 (kv heads repeated)."""
    T = q.size(-2)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        mask[i, max(0, i - window):i + 1] = 0.0
    rep = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q.double() @ k.double().mT / q.size(-1) ** 0.5 + mask
    return torch.softmax(scores, dim=-1) @ v.double()


@pytest.fixture
def notices(monkeypatch, capsys):
    """The fallback notices printed from here on (each once per op and reason): a fresh record."""
    monkeypatch.setattr(kernels, "_noticed", set())
    capsys.readouterr()
    return lambda: [line for line in capsys.readouterr().out.splitlines() if line.startswith("kernels: ")]


def test_every_reference_runs_on_cpu_without_a_notice(notices):
    torch.manual_seed(0)
    B, T, H, D = 2, 16, 4, 8
    x = torch.randn(B, T, H, D, requires_grad=True)
    cos, sin = torch.randn(2, 1, T, 1, D // 2).unbind(0)
    y = kernels.rotary_norm(x, cos, sin)
    r1 = x[..., :D // 2] * cos + x[..., D // 2:] * sin
    r2 = x[..., D // 2:] * cos - x[..., :D // 2] * sin
    r = torch.cat([r1, r2], -1)
    rms = r.square().mean(-1, keepdim=True).add(1.1920928955078125e-07).sqrt()  # F.rms_norm's eps: float32's
    assert torch.allclose(y, r / rms, atol=1e-5)
    y.sum().backward()
    assert x.grad is not None

    q = torch.randn(B, H, T, D)
    k, v = torch.randn(2, B, H // 2, T, D).unbind(0)  # grouped-query: 2 kv heads for 4 query heads
    for mask, window in [(None, T), (5, 5), (kernels.attention_masks([5], T, torch.device("cpu"))[5], 5)]:
        out = kernels.attention(q, k, v, mask)
        assert torch.allclose(out.double(), loop_attention(q, k, v, window), atol=1e-5), mask
    ref = kernels.attention_reference(q, k, v, 5)  # a window size (an int): the dense mask made on the spot
    assert torch.allclose(ref.double(), loop_attention(q, k, v, 5), atol=1e-5)

    xs, w, t = torch.randn(10, D), torch.randn(50, D) * 5, torch.randint(0, 50, (10,))
    t[3] = -1
    ce = torch.nn.functional.cross_entropy
    assert torch.allclose(kernels.head_loss(xs, w, t, "sum"),
                          ce(15 * torch.tanh(xs @ w.t() / 15), t, ignore_index=-1, reduction="sum"))
    assert torch.allclose(kernels.head_loss(xs, w, t, cap=None), ce(xs @ w.t(), t, ignore_index=-1))
    assert notices() == []  # on the CPU the references are the plan, not a fallback


def test_attention_refuses_a_mask_it_cannot_read():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(TypeError, match="mask must be None, a window size"):
        kernels.attention(q, q, q, "SSSL")


def test_what_the_fast_paths_take_and_why_not():
    """The conditions are checked on shapes and dtypes only, so they can be tested on CPU tensors."""
    if kernels.triton is None or kernels.cudnn is None:
        pytest.skip("needs Triton and cuDNN's Python API (Linux)")
    bf = torch.bfloat16
    x, cs = torch.randn(2, 16, 4, 128, dtype=bf), torch.randn(1, 16, 1, 64, dtype=bf)
    assert kernels._rotary_problem(x, cs, cs) is None
    assert "cos and sin are not [1, T, 1, D / 2]" in kernels._rotary_problem(x, cs[0], cs[0])
    assert "cos and sin are not" in kernels._rotary_problem(x, cs[:, :8], cs[:, :8])
    assert "head dim is odd" in kernels._rotary_problem(torch.randn(2, 16, 4, 7), cs, cs)
    assert "x is 3-d" in kernels._rotary_problem(x[0], cs, cs)
    assert "float64" in kernels._rotary_problem(x.double(), cs, cs)
    assert "requires grad" in kernels._rotary_problem(x, cs.clone().requires_grad_(), cs)

    q, kv = torch.randn(2, 4, 16, 128, dtype=bf), torch.randn(2, 2, 16, 128, dtype=bf)
    assert kernels._window_problem(q, q, q, 8) is None and kernels._window_problem(q, kv, kv, 8) is None
    assert "bfloat16 or float16" in kernels._window_problem(q.float(), q.float(), q.float(), 8)
    big = torch.randn(2, 4, 16, 256, dtype=bf)
    assert "head dim over 128" in kernels._window_problem(big, big, big, 8)
    odd = torch.randn(2, 3, 16, 128, dtype=bf)
    assert "do not divide the heads" in kernels._window_problem(q, odd, odd, 8)
    assert "k and v differ" in kernels._window_problem(q, q, kv, 8)
    assert "negative" in kernels._window_problem(q, q, q, -1)
    assert "not contiguous" in kernels._window_problem(q.mT.contiguous().mT, q, q, 8)

    h, w, t = torch.randn(6, 32), torch.randn(100, 32), torch.randint(0, 100, (6,))
    assert kernels._loss_problem(h, w, t, "mean", 15.0, True) is None
    assert kernels._loss_problem(h, w, t, "none", 15.0, False) is None
    assert "'sum'" in kernels._loss_problem(h, w, t, "sum", 15.0, True)
    assert "no backward" in kernels._loss_problem(h, w, t, "none", 15.0, True)
    assert "cap None" in kernels._loss_problem(h, w, t, "mean", None, True)
    assert "3-d, 2-d, 1-d" in kernels._loss_problem(h[None], w, t, "mean", 15.0, True)
    assert "over 65536" in kernels._loss_problem(h, torch.randn(2**16 + 1, 32), t, "mean", 15.0, True)
    assert "not a positive number" in kernels._loss_problem(h, w, t, "mean", torch.tensor(15.0), True)
    assert "int64" in kernels._loss_problem(h, w, t.int(), "mean", 15.0, True)


def test_a_notice_is_one_line_once_and_compiles_without_a_graph_break(notices):
    """The notice runs while torch.compile traces (a print would otherwise break the graph)."""
    def step(x, cos, sin):
        problem = kernels._rotary_problem(x, cos, sin)
        if problem:
            kernels.notice("rotary_norm", problem)
        return kernels.rotary_norm_reference(x, cos, sin)

    if kernels.triton is None:
        pytest.skip("needs Triton (Linux)")
    x, cs = torch.randn(2, 8, 2, 16, dtype=torch.float64), torch.randn(1, 8, 1, 8)
    explained = torch._dynamo.explain(step)(x, cs, cs)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    compiled = torch.compile(step, backend="eager", fullgraph=True, dynamic=False)
    for _ in range(3):
        assert torch.allclose(compiled(x, cs, cs), kernels.rotary_norm_reference(x, cs, cs))
    step(x, cs, cs)
    (line,) = notices()
    assert line == ("kernels: rotary_norm runs in plain PyTorch (slower): dtypes torch.float64, "
                    "torch.float32, torch.float32; the kernel takes bfloat16, float16 or float32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_unsupported_inputs_fall_back_on_cuda_with_a_notice(compiled, notices):
    """An edit that changes a shape, a dtype or a mask: the reference's result, one notice per op and
    reason, no crash, no graph break."""
    torch.manual_seed(0)
    torch._dynamo.reset()  # trace again, so the notices are printed again
    compile = (lambda f: torch.compile(f, dynamic=False, fullgraph=True)) if compiled else (lambda f: f)
    B, T, H, D = 2, 64, 4, 64
    x = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    cos, sin = torch.randn(2, T, 1, D // 2, device="cuda").unbind(0)  # [T, 1, D/2]: broadcasts, not 4-d
    rotary = compile(kernels.rotary_norm)
    expected = kernels.rotary_norm_reference(x, cos, sin)
    assert torch.allclose(rotary(x, cos, sin), expected, rtol=1e-3, atol=1e-4)

    attention = compile(kernels.attention)
    q, k, v = torch.randn(3, B, H, T, D, device="cuda").unbind(0)  # float32: cuDNN takes bf16/fp16
    ref = loop_attention(q.cpu(), k.cpu(), v.cpu(), 10)
    assert (attention(q, k, v, 10).cpu().double() - ref).abs().max() < 1e-4
    q2, k2, v2 = (t.repeat(1, 1, 1, 4).bfloat16() for t in (q, k, v))  # head dim 256
    out = attention(q2, k2, v2, 10).float()
    ref2 = kernels.attention_reference(q2.float(), k2.float(), v2.float(), 10)
    assert (out - ref2).norm() / ref2.norm() < 1e-2
    dense = kernels.dense_mask(10, T, q.device)
    assert (attention(q, k, v, dense).cpu().double() - ref).abs().max() < 1e-4

    loss = compile(kernels.head_loss)
    h = torch.randn(32, 16, device="cuda", requires_grad=True)
    w = torch.randn(100, 16, device="cuda", requires_grad=True)
    t = torch.randint(0, 100, (32,), device="cuda")
    ref = kernels.head_loss_reference
    total = loss(h, w, t, "sum") + loss(h, w, t, "mean", None) + loss(h, w, t, "none").sum()  # with gradients
    expected = ref(h, w, t, "sum") + ref(h, w, t, "mean", None) + ref(h, w, t, "none").sum()
    assert torch.allclose(total, expected, rtol=1e-4)
    total.backward()
    assert h.grad is not None and w.grad is not None

    said = notices()
    for op, why in [("rotary_norm", "cos and sin are not"), ("attention", "dtypes torch.float32"),
                    ("attention", "head dim over 128"), ("attention", "dense mask tensor"),
                    ("head_loss", "'sum'"), ("head_loss", "cap None"), ("head_loss", "no backward")]:
        lines = [s for s in said if s.startswith(f"kernels: {op} runs in plain PyTorch") and why in s]
        assert len(lines) == 1, (op, why, said)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_window_attention_with_grouped_query_heads_on_cuda(notices):
    """Fewer kv heads than query heads (N_KV_HEAD_DIVISOR > 1) stay on cuDNN: forward and backward against
    float32 attention with the dense mask."""
    torch.manual_seed(0)
    T, window = 256, 100
    q = torch.randn(2, 4, T, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, T, 64, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    out = kernels.attention(q, k, v, window)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = kernels.attention_reference(qf, kf, vf, kernels.dense_mask(window, T, q.device))
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), g.float())
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        assert (a.float() - b).norm() / b.norm() < 1e-2
    assert notices() == []  # the fast path
