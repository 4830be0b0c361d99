"""Issue #42 item 6: regions for any model. A conv net's convolutions, batch norms and activations (module scopes
and parameter names; its ReLU is no MLP), BERT's parameter names, and GEMM shapes no coincidence of sizes can
fool (tokens per micro-batch equal to the hidden size)."""
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.tables import regions

C, V = 768, 50304


@pytest.fixture(scope="module")
def placer():
    params = regions.Parameters({"h.0.attn.c_q.weight": [C, C], "h.0.attn.c_proj.weight": [C, C],
                                 "h.0.mlp.c_fc.weight": [4 * C, C], "h.0.mlp.c_proj.weight": [C, 4 * C],
                                 "lm_head.weight": [V, C]})
    return regions.Placer(params, tokens=C)  # tokens per micro-batch == the hidden size


@pytest.mark.parametrize("dims, region", [
    ([[C, C], [C, V]], "head and loss"),          # forward x @ W^T: x has an attention weight's shape
    ([[C, V], [V, C]], "head and loss"),          # input gradient dY @ W
    ([[V, C], [C, C]], "head and loss"),          # weight gradient dY^T @ x: makes the head's shape
    ([[C, C], [C, C]], "attention"),
    ([[C, C], [C, 4 * C]], "MLP"),                # c_fc forward
    ([[C, 4 * C], [4 * C, C]], "MLP"),            # c_proj forward, or c_fc's input gradient
])
def test_a_coincidence_of_sizes_does_not_move_a_gemm(placer, dims, region):
    shares, _, _ = placer.place("nvjet", "GEMM", {"name": "aten::mm", "args": {"Input Dims": dims}})
    assert shares == ((region, 1.0),)


def test_tokens_per_micro_batch_from_the_gemms():
    ops = [{"name": "aten::mm", "args": {"Input Dims": [[4096, 512], [512, 512]]}}] * 3 + [
        {"name": "aten::mm", "args": {"Input Dims": [[512, 4096], [4096, 512]]}}]
    assert regions.tokens_of(ops) == 4096
    assert regions.tokens_of([{"name": "aten::add"}]) is None


class Net(torch.nn.Module):
    """A small ResNet-like conv net, as torchvision names its layers."""

    def __init__(self):
        super().__init__()
        # 32 channels on 32 x 32 images: the convolutions' work (75M multiply-adds each) outweighs the norms'
        # per-operator overhead, which at 16 channels on 16 x 16 a loaded host could make the larger
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32)
        self.layer1 = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.BatchNorm2d(32),
                                          torch.nn.ReLU())
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = self.layer1(F.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    path = tmp_path_factory.mktemp("cnn") / "trace.json"
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(3):
            F.cross_entropy(model(torch.randn(8, 3, 32, 32)), torch.randint(0, 10, (8,))).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return load_trace(str(path))


def test_a_conv_net_has_convolutions_and_no_mlp(cnn):
    s = summarize(cnn)
    rows = {r["region"]: r for r in s["regions"]["rows"]}
    assert rows["convolution"]["forward_ms"] > 0 and rows["convolution"]["backward_ms"] > 0
    assert rows["MLP"]["ms_per_step"] == 0  # its ReLUs are its convolution blocks'
    assert rows["convolution"]["ms_per_step"] > rows["norms and residuals"]["ms_per_step"] > 0
    assert s["regions"]["attributed_percent"] >= 70  # 79-90% measured: a live CPU profile's times vary with load


def test_conv_net_parameters_and_module_names():
    assert regions.path_region("conv2d") == "convolution" and regions.path_region("batch_norm2d") == \
        "norms and residuals"
    params = regions.Parameters({"features.0.weight": [64, 3, 11, 11], "features.0.bias": [64],
                                 "classifier.1.weight": [4096, 9216]})
    assert params.region["features.0.weight"] == "convolution"   # AlexNet's: named by its 4-D shape
    assert params.region["features.0.bias"] is None
    assert regions.activation_region(params, None, []) == "convolution"
    assert regions.activation_region(regions.Parameters({"h.0.mlp.fc.weight": [8, 8]}), None, []) == "MLP"


def test_a_torch_1_9_resnet50_trace_is_placed_by_its_operators():
    """Kineto's V100 ResNet-50 sample: no parameter metadata, no External id on its launches (the operator around
    each launch is its own), cuDNN's convolution and batch-norm kernels: 3.5% attributed before, its ReLUs as MLP."""
    import os
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "foreign")
    s = summarize(load_trace(os.path.join(data, "kineto-v100-resnet50-train.json.gz")))
    rows = {r["region"]: r["ms_per_step"] for r in s["regions"]["rows"]}
    assert s["regions"]["attributed_percent"] >= 90
    assert rows["MLP"] == 0 and rows["convolution"] == max(rows[r] for r in regions.MODEL_REGIONS)
    assert rows["norms and residuals"] > 0
