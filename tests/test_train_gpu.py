"""A few real CUDA steps of the compiled model. Skipped without a GPU."""
import pytest
import torch

import kernels
import train
from profiling import runner

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_compiled_model_trains_a_few_cuda_steps():
    torch.manual_seed(0)
    cfg = train.GPTConfig(sequence_len=256, vocab_size=512, n_layer=2, n_head=2, n_kv_head=2, n_embd=256,
                          window_pattern="SL")
    with torch.device("cuda"):
        model = train.GPT(cfg)
    model.init_weights()
    model.setup_attention()
    optimizer = train.make_optimizer(model)
    batches = iter([(*torch.randint(0, 512, (2, 4, 256), device="cuda").unbind(0), 0)] * 100)
    step_fn, _ = train.make_train_step(model, optimizer, batches, 2, torch.autocast("cuda", torch.bfloat16),
                                       runner.Ranks(cuda=True))
    losses = [step_fn(step, 0.0).item() for step in range(8)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


@cuda
@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_attention_matches_dense_mask(compiled):
    """The windows on cuDNN's band mask (window T - 1: every key but the first, for the last query) and
    plain causal attention: outputs and gradients against float32 attention with the dense mask."""
    torch.manual_seed(0)
    T = 512
    leaves = [x.requires_grad_() for x in torch.randn(3, 2, T, 4, 64, device="cuda", dtype=torch.bfloat16)]
    q, k, v = (x.transpose(1, 2) for x in leaves)  # [B, H, T, D] views of [B, T, H, D], as the model has them
    g = torch.randn(2, 4, T, 64, device="cuda", dtype=torch.bfloat16)
    attend = kernels.attention
    attend = torch.compile(attend, dynamic=False, fullgraph=True) if compiled else attend
    i = torch.arange(T, device="cuda")
    for window in (1, 100, T // 2, T - 1, T):
        mask = kernels.attention_masks([window], T, torch.device("cuda"))[window]
        out = attend(q, k, v, mask)
        grads = [x.transpose(1, 2) for x in torch.autograd.grad(out, leaves, g)]
        qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
        dense = kernels.window_mask(window)(None, None, i[:, None], i[None, :])
        ref = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=dense)
        ref_grads = torch.autograd.grad(ref, (qf, kf, vf), g.float())
        for a, b in zip((out, *grads), (ref, *ref_grads)):
            assert (a.float() - b).norm() / b.norm() < 1e-2, window


@cuda
def test_compiled_ddp_model_trains_like_the_plain_model():
    """torch.compile of the DDP-wrapped model (DDP's graph splitting), with the fast kernels and no_sync on
    the first micro-batch, on a process group of one GPU: the same losses as the plain compiled model."""
    import torch.distributed as dist
    cfg = train.GPTConfig(sequence_len=256, vocab_size=512, n_layer=2, n_head=2, n_kv_head=2, n_embd=256,
                          window_pattern="SL")
    batches = [(*torch.randint(0, 512, (2, 4, 256), device="cuda").unbind(0), 0) for _ in range(16)]

    def losses(ranks):
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = train.GPT(cfg)
        model.init_weights()
        model.setup_attention()
        step_fn, _ = train.make_train_step(model, train.make_optimizer(model), iter(batches * 2), 2,
                                           torch.autocast("cuda", torch.bfloat16), ranks)
        return [step_fn(step, 0.0).item() for step in range(6)]

    plain = losses(runner.Ranks(cuda=True))
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        ranks = runner.Ranks(cuda=True)
        ranks.world_size = 2  # wrap in DDP although the group has one rank: the multi-GPU code path
        wrapped = losses(ranks)
    finally:
        dist.destroy_process_group()
    assert all(abs(a - b) / abs(b) < 2e-2 for a, b in zip(wrapped, plain)), (wrapped, plain)
