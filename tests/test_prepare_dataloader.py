"""make_dataloader (best-fit packing) and evaluate_bpb, on the session's prepared builtin cache."""
import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

import prepare
from prepare import Tokenizer, best_fit_rows, make_dataloader

# ---------------------------------------------------------------------------
# Packing, against a direct transcription of upstream's algorithm
# ---------------------------------------------------------------------------

def reference_rows(token_batches, B, row_len, buffer_size):
    """Upstream's best-fit, written plainly: scan the buffer for the longest doc that fits (first wins
    ties), else crop the shortest (first wins ties)."""
    buffer, epoch = [], 1
    while True:
        rows = []
        for _ in range(B):
            row = []
            while len(row) < row_len:
                while len(buffer) < buffer_size:
                    docs, epoch = next(token_batches)
                    buffer.extend(docs)
                remaining = row_len - len(row)
                best, best_len = -1, 0
                for i, doc in enumerate(buffer):
                    if best_len < len(doc) <= remaining:
                        best, best_len = i, len(doc)
                if best >= 0:
                    row += buffer.pop(best)
                else:
                    shortest = min(range(len(buffer)), key=lambda i: len(buffer[i]))
                    row += buffer.pop(shortest)[:remaining]
            rows.append(row)
        yield rows, epoch


def random_batches(seed, row_len, batch=7, per_epoch=5):
    """Endless batches of BOS-led docs with many equal lengths (to exercise ties); epochs of 5 batches."""
    rng, serial, n = random.Random(seed), 0, 0
    while True:
        docs = []
        for _ in range(batch):
            length = rng.choice([1, 2, 3, row_len, row_len + 1, rng.randint(1, 3 * row_len)])
            docs.append([-1] + [serial * 1000 + j for j in range(length - 1)])  # unique tokens per doc
            serial += 1
        yield docs, 1 + n // per_epoch
        n += 1


@pytest.mark.parametrize("seed,B,row_len,buffer_size", [(0, 4, 17, 10), (1, 3, 9, 1), (2, 8, 33, 50),
                                                         (3, 2, 5, 3)])
def test_best_fit_matches_upstream_exactly(seed, B, row_len, buffer_size):
    fast = best_fit_rows(random_batches(seed, row_len), B, row_len, buffer_size)
    slow = reference_rows(random_batches(seed, row_len), B, row_len, buffer_size)
    epochs = set()
    for _ in range(40):
        (rows, epoch), (ref, ref_epoch) = next(fast), next(slow)
        assert rows.shape == (B, row_len) and rows.tolist() == ref and epoch == ref_epoch
        epochs.add(epoch)
    assert len(epochs) > 1  # the epoch counter moved on, in step with upstream


# ---------------------------------------------------------------------------
# Invariants on real data
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(prepared_cache):
    return Tokenizer.from_directory()


@pytest.fixture(scope="module")
def val_docs(tok):
    """Token lists of the documents of the validation shard, BOS first."""
    docs = []
    for texts, epoch in prepare.document_batches("val"):
        if epoch > 1:
            return docs
        docs += tok.encode(texts, prepend=tok.get_bos_token_id())


def test_rows_start_with_bos_and_shift_by_one(tok):
    B, T = 8, 64
    loader = make_dataloader(tok, B, T, "train")
    for _ in range(5):
        x, y, epoch = next(loader)
        assert x.shape == y.shape == (B, T) and x.dtype == y.dtype == torch.long
        assert x.device.type == "cpu" and epoch == 1
        assert (x[:, 0] == tok.get_bos_token_id()).all()
        assert torch.equal(x[:, 1:], y[:, :-1])
        assert ((x >= 0) & (x < tok.get_vocab_size())).all()


def test_documents_are_split_only_where_cropped(tok, val_docs):
    """Cut each row of T + 1 tokens at its BOS tokens: every piece is a whole validation document, except
    the last piece of a row, which may be cropped. No padding: the pieces fill the row exactly."""
    B, T, bos = 16, 128, tok.get_bos_token_id()
    whole = {tuple(d) for d in val_docs}
    loader = make_dataloader(tok, B, T, "val", buffer_size=100)
    cropped = multi = 0
    for _ in range(6):
        x, y, _ = next(loader)
        for row in torch.cat([x, y[:, -1:]], dim=1).tolist():
            starts = [i for i, t in enumerate(row) if t == bos] + [T + 1]
            assert starts[0] == 0
            pieces = [tuple(row[a:b]) for a, b in itertools.pairwise(starts)]
            assert sum(map(len, pieces)) == T + 1
            assert all(p in whole for p in pieces[:-1])
            if pieces[-1] not in whole:
                cropped += 1
                assert any(d[:len(pieces[-1])] == pieces[-1] for d in whole if len(d) > len(pieces[-1]))
            multi += len(pieces) > 1
    assert cropped and multi  # both cases seen, so the test means something


def test_batches_are_fresh_tensors(tok):
    loader = make_dataloader(tok, 2, 32, "train")
    x1, _, _ = next(loader)
    saved = x1.clone()
    x2, _, _ = next(loader)
    assert torch.equal(x1, saved) and not torch.equal(x1, x2)


def test_val_is_deterministic_and_differs_from_train(tok):
    a = next(make_dataloader(tok, 4, 64, "val"))[0]
    b = next(make_dataloader(tok, 4, 64, "val"))[0]
    c = next(make_dataloader(tok, 4, 64, "train"))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_epochs_count_passes_over_the_split(val_docs):
    counts = {}
    for texts, epoch in prepare.document_batches("val", batch_size=50):
        counts[epoch] = counts.get(epoch, 0) + len(texts)
        if epoch == 3:
            break
    assert counts[1] == counts[2] == len(val_docs)


def test_bad_split(tok):
    with pytest.raises(ValueError):
        next(make_dataloader(tok, 2, 8, "test"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_equal_cpu_batches(tok):
    cpu, gpu = make_dataloader(tok, 4, 64, "val"), make_dataloader(tok, 4, 64, "val", device="cuda")
    for _ in range(3):
        (x, y, _), (gx, gy, _) = next(cpu), next(gpu)
        assert gx.is_cuda and torch.equal(gx.cpu(), x) and torch.equal(gy.cpu(), y)

# ---------------------------------------------------------------------------
# evaluate_bpb against a hand computation
# ---------------------------------------------------------------------------

class TokenLoss(torch.nn.Module):
    """Per-token 'loss' that depends only on the target id, so the hand computation can redo it."""

    def __init__(self, flat=False):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.flat, self.calls = flat, 0

    def forward(self, x, y, reduction="mean"):
        assert reduction == "none"
        self.calls += 1
        loss = 0.25 + 0.01 * (y % 17).float()
        return loss.view(-1) if self.flat else loss


class Uniform(torch.nn.Module):
    """Logits all zero: cross-entropy is ln(V) for every token."""

    def __init__(self, vocab):
        super().__init__()
        self.head = torch.nn.Embedding(vocab, vocab)
        torch.nn.init.zeros_(self.head.weight)

    def forward(self, x, y, reduction="mean"):
        logits = self.head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction=reduction)
        return loss.view(y.shape)


@pytest.fixture
def small_eval(monkeypatch):
    monkeypatch.setattr(prepare, "MAX_SEQ_LEN", 32)
    monkeypatch.setattr(prepare, "EVAL_TOKENS", 3 * 4 * 32 + 5)  # 3 steps at batch 4


def by_hand(tok, batch_size, steps, loss_of):
    """Sum the per-token nats and UTF-8 bytes of every non-special target, one token at a time."""
    special = set(tok.special_tokens.values())
    loader = make_dataloader(tok, batch_size, prepare.MAX_SEQ_LEN, "val")
    nats = nbytes = 0
    for _ in range(steps):
        _, y, _ = next(loader)
        for t in y.view(-1).tolist():
            if t not in special:
                nats += loss_of(t)
                nbytes += len(tok.enc.decode_single_token_bytes(t))
    return nats / (math.log(2) * nbytes)


@pytest.mark.parametrize("flat", [False, True])
def test_bpb_of_a_token_loss_model(tok, small_eval, flat):
    model = TokenLoss(flat)
    got = prepare.evaluate_bpb(model, tok, batch_size=4)
    assert model.calls == 3
    assert got == pytest.approx(by_hand(tok, 4, 3, lambda t: 0.25 + 0.01 * (t % 17)), rel=1e-6)


def test_bpb_of_a_uniform_model(tok, small_eval):
    V = tok.get_vocab_size()
    got = prepare.evaluate_bpb(Uniform(V), tok, batch_size=4)
    assert got == pytest.approx(by_hand(tok, 4, 3, lambda t: math.log(V)), rel=1e-5)
    assert 1.0 < got < math.log2(V)  # more than a bit per byte, less than a token's worth


def test_bpb_runs_at_least_one_step(tok, small_eval, monkeypatch):
    monkeypatch.setattr(prepare, "EVAL_TOKENS", 1)
    model = TokenLoss()
    prepare.evaluate_bpb(model, tok, batch_size=4)
    assert model.calls == 1
