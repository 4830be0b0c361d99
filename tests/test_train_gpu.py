"""A few real CUDA steps of the compiled model. Skipped without a GPU."""
import pytest
import torch

import train

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
    step_fn, _ = train.make_train_step(model, optimizer, batches, 2, torch.autocast("cuda", torch.bfloat16))
    losses = [step_fn(step, 0.0).item() for step in range(8)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


@cuda
def test_flex_attention_on_cuda_matches_dense_mask():
    torch.manual_seed(0)
    T = 512
    q, k, v = torch.randn(3, 2, 4, T, 64, device="cuda", dtype=torch.bfloat16).unbind(0)
    flex = torch.compile(train.attend)
    i = torch.arange(T, device="cuda")
    for window in (T // 2, T):
        block = train.build_attention_masks([window], T, torch.device("cuda"))[window]
        dense = train.window_mask(window)(None, None, i[:, None], i[None, :])
        out = flex(q, k, v, block)  # window T: the cuDNN causal path
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense)
        assert (out.float() - ref).norm() / ref.norm() < 1e-2
