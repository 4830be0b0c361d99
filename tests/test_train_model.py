"""train.py's parts on CPU: attention masks, Muon's orthogonalisation, FLOPs accounting, schedules."""
import math

import pytest
import torch

import kernels
import train
from profiling.profile.trace import hardware


def dense_reference(q, k, v, window):
    """Attention with an explicit mask built by loops, in float64."""
    T = q.size(-2)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        for j in range(max(0, i - window), i + 1):
            mask[i, j] = 0.0
    scores = q.double() @ k.double().mT / math.sqrt(q.size(-1)) + mask
    return torch.softmax(scores, dim=-1) @ v.double()


@pytest.mark.parametrize("window", [1, 16, 63, 64, 200])
def test_sliding_window_attention_equals_dense_reference(window):
    torch.manual_seed(window)
    T = 64
    q, k, v = torch.randn(3, 2, 3, T, 16).unbind(0)
    ref = dense_reference(q, k, v, window)
    mask = kernels.attention_masks([window], T, torch.device("cpu"))[window]
    assert (mask is None) == (window >= T)  # a window covering the sequence is plain causal attention
    dense = kernels.attention(q, k, v, mask)
    assert torch.allclose(dense.double(), ref, atol=1e-5)  # the CUDA path: tests/test_train_gpu.py


def test_window_sizes_follow_pattern_and_last_layer_is_full():
    cfg = train.GPTConfig(sequence_len=64, vocab_size=32, n_layer=6, n_head=1, n_kv_head=1, n_embd=128,
                          window_pattern="SSSL")
    assert train.GPT(cfg).window_sizes == [32, 32, 32, 64, 32, 64]


@pytest.mark.parametrize("shape", [(4, 128, 128), (3, 512, 128), (2, 96, 384)])
def test_orthogonalize_gives_singular_values_near_one(shape):
    torch.manual_seed(0)
    sv = torch.linalg.svdvals(train.orthogonalize(torch.randn(shape)).float())
    # Polar Express (bf16 on the GPU, float32 on the CPU) lands the singular values in a band around 1 (not
    # exactly 1, by design).
    # A square Gaussian matrix has a few singular values near 0 that 5 iterations cannot lift all the way.
    in_band = ((sv > 0.7) & (sv < 1.3)).float().mean()
    assert in_band > (0.95 if shape[1] == shape[2] else 0.999)
    assert sv.max() < 1.3
    assert abs(sv.mean().item() - 1) < 0.1
    raw = torch.linalg.svdvals(torch.randn(shape))  # what it started from: spread by 3x or more
    assert raw.max() / raw.min() > 2.5


def test_default_model_has_upstream_size_and_flops():
    cfg = train.GPTConfig(sequence_len=2048, vocab_size=8192, n_layer=8, n_head=4, n_kv_head=4, n_embd=512,
                          window_pattern="SSSL")
    with torch.device("meta"):
        model = train.GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert round(n / 1e6, 1) == 50.3
    non_embedding = n - 8192 * 512 * 5 - 16  # wte + 4 value embeddings + 16 scalars
    attention = 12 * 4 * 128 * (1024 * 6 + 2048 * 2)  # SSSL SSSL with the last layer full: 6 S, 2 L
    assert model.flops_per_token() == 6 * non_embedding + attention


def test_loss_falls_when_fitting_a_batch():
    torch.manual_seed(0)
    cfg = train.GPTConfig(sequence_len=64, vocab_size=64, n_layer=2, n_head=1, n_kv_head=1, n_embd=128,
                          window_pattern="SL")
    model = train.GPT(cfg)
    model.init_weights()
    model.setup_attention()
    # on the CPU train.py runs float32 throughout, embeddings included (bf16 matmuls are slow without native
    # support), and no autocast
    assert train.DTYPE == model.wte.weight.dtype == model.cos.dtype == torch.float32
    opt = train.make_optimizer(model)
    x, y = torch.randint(0, 64, (2, 4, 64)).unbind(0)
    losses = []
    for step in range(20):
        loss = model(x, y)
        loss.backward()
        train.set_schedules(opt, step, 0.0)
        opt.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_lr_schedule_is_constant_then_linear_warmdown():
    assert train.lr_multiplier(0.0) == 1.0
    assert train.lr_multiplier(0.5) == 1.0
    assert train.lr_multiplier(0.75) == pytest.approx(0.5)
    assert train.lr_multiplier(1.0) == 0.0
    assert train.muon_momentum(0) == 0.85 and train.muon_momentum(150) == pytest.approx(0.90)
    assert train.muon_momentum(1000) == 0.95


def test_batch_sizes_that_do_not_divide_are_refused(monkeypatch):
    monkeypatch.setattr(train, "TOTAL_BATCH_SIZE", 1000)
    with pytest.raises(ValueError, match="TOTAL_BATCH_SIZE .* DEVICE_BATCH_SIZE"):
        train.check_batch_sizes(1)


@pytest.mark.parametrize("name,tflops", [
    ("NVIDIA H100 80GB HBM3", 989.5), ("NVIDIA H100 PCIe", 756.5), ("NVIDIA H200", 989.5),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.05), ("NVIDIA GeForce RTX 4090", 165.2),
    ("NVIDIA B200", 2250.0), ("NVIDIA L4", 121.0), ("NVIDIA GH200 480GB", 989.5),
    ("NVIDIA L40", 181.05), ("Tesla V100-SXM2-16GB", 125.0), ("Some Future GPU", None), ("cpu", None),
])
def test_peak_flops_table(name, tflops):
    peak = hardware.peak_flops(name)
    assert peak == (None if tflops is None else tflops * 1e12)


def test_muon_update_matches_plain_math():
    """The fused Muon step: momentum, orthogonalised update, cautious decay only where signs agree."""
    torch.manual_seed(0)
    p = torch.randn(1, 8, 8)
    g = torch.randn(1, 8, 8)
    mom, var = torch.zeros_like(g), torch.zeros(1, 8, 1)
    before = p.clone()
    t = lambda v: torch.tensor(v)  # noqa: E731
    train.muon_update(g.clone(), p, mom, var, t(0.9), t(0.1), t(0.0), t(0.95), -1)
    assert torch.allclose(mom, 0.1 * g)
    delta = before - p
    assert delta.abs().max() > 0
    # with no weight decay the step is lr x a normalised direction: its rows have similar norms
    norms = delta[0].norm(dim=-1)
    assert norms.max() / norms.min() < 1.5
