"""The cases of benchmarks/findings/planted/diagnoses.py: each a slowdown planted in a copy of train.py by
exact text replacement, with what its finding must show, and the checks that a plant still applies (nothing
runs).

    Case(planted, kinds, edits, load, words, line, listed, against)   # one case (fields below)
    CASES, NEW_CASES, GROUPS            # every case; issue #33's; the group names `--cases` accepts
    plant(case, source) -> source       # the case's edits applied (SystemExit when one no longer applies)
    check_source(case, source)          # PlantError unless the planted file compiles and imports what it uses
"""
import ast
import sys
from typing import NamedTuple


class Case(NamedTuple):
    planted: str              # what is planted, in words
    kinds: tuple              # finding kinds that name it (issue #16's rule); empty: a quiet case
    edits: list               # [(text in train.py, exactly once; its replacement)]
    load: str = None          # Python source run beside the case (another process on the GPU), or None
    words: tuple = ()         # issue #33: the top finding's evidence or fix names the cause by one of these
    line: str = None          # issue #33: a planted line a stack ties the cause to (its text, unique)
    listed: tuple = ()        # issue #33: the setting, as the header's settings list shows it (name=value)
    against: str = None       # the case whose unprofiled step is the reference (default: the baseline)


# 50 ms of Python per micro-batch in the input pipeline (the plants hidden_host_work and sync_exposes_host)
HOST_WORK_50MS = [
    ("            batch = next(loader)  # the next batch is prepared while the GPU works\n",
     "            batch = preprocess(next(loader))  # planted\n"),
    ("def make_train_step(", ("def preprocess(batch):  # planted: Python work on every batch\n"
                             "    t0 = time.perf_counter()\n    while time.perf_counter() - t0 < 0.05:\n"
                             "        pass\n    return batch\n\n\ndef make_train_step(")),
    ("import math\n", "import math\nimport time  # planted\n")]

# name -> (what is planted, finding kinds that name it, [(text in train.py, replacement)], background load):
# Case's first four fields; the earlier plants, unchanged (issues #16, #26 and after)
CASES = {
    "baseline": ("nothing: the default train.py", (), [], None),
    "host_sync": (
        "the loss read with .item() after every micro-batch's backward (a host sync before the next batch)",
        ("host_sync",),
        [("                (loss / grad_accum_steps).backward()\n",
          ("                (loss / grad_accum_steps).backward()\n"
           "            last_loss = loss.item()  # planted\n"))],
        None),
    "nan_check": (
        "a NaN check after every block (`if torch.isnan(x).any(): raise`): graph breaks and host syncs",
        ("graph_break", "host_sync"),
        [("        return x + self.mlp(norm(x))\n",
          ("        x = x + self.mlp(norm(x))\n        if torch.isnan(x).any():  # planted\n"
           "            raise FloatingPointError('NaN in a block')\n        return x\n"))],
        None),
    "fp32_mlp": (
        "the MLP left in float32 (autocast off around it)",
        ("fp32_matmul", "fp32_intermediate"),
        [("        return self.c_proj(F.relu(self.c_fc(x)).square())\n",
          ("        with torch.autocast(x.device.type, enabled=False):  # planted\n"
           "            return self.c_proj(F.relu(self.c_fc(x.float())).square())\n"))],
        None),
    "dense_mask": (
        "the sliding window as a dense boolean mask passed to scaled_dot_product_attention",
        ("attention_fallback",),
        [("        self.masks = kernels.attention_masks(self.window_sizes, self.config.sequence_len, "
          "self.cos.device)\n",
          ("        T, device = self.config.sequence_len, self.cos.device  # planted: dense boolean masks\n"
           "        self.masks = {w: kernels.dense_mask(w, T, device) if w < T else None\n"
           "                      for w in set(self.window_sizes)}\n"))],
        None),
    "small_batch": (
        "DEVICE_BATCH_SIZE 16 instead of 128 (16 micro-batches of small kernels per step)",
        ("launch_bound",),
        [("DEVICE_BATCH_SIZE = 128 ", "DEVICE_BATCH_SIZE = 16  ")],
        None),
    "slow_input": (
        "200 ms of Python preprocessing per micro-batch in the input pipeline",
        ("gpu_waits_on_host",),
        [("            batch = next(loader)  # the next batch is prepared while the GPU works\n",
          "            batch = preprocess(next(loader))  # planted\n"),
         ("def make_train_step(", ("def preprocess(batch):  # planted: slow Python work on every batch\n"
                                  "    t0 = time.perf_counter()\n    while time.perf_counter() - t0 < 0.2:\n"
                                  "        pass\n    return batch\n\n\ndef make_train_step(")),
         ("import math\n", "import math\nimport time  # planted\n")],
        None),
    "shared_gpu": (
        "another process running bf16 matmuls on the same GPU (the GPU is slow, not the code)",
        ("slow_device",),
        [],
        "import torch\na = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nwhile True:\n    a @ a\n"),
    # issue #26: causes no rule was written for when they were planted
    "eager_model": (
        "the model left uncompiled (the optimizer's update functions stay compiled)",
        ("eager_code", "regression"),
        [("    forward = torch.compile(ddp, dynamic=False) if COMPILE else ddp\n",
          "    forward = ddp  # planted: no torch.compile\n")],
        None),
    "eager_optimizer": (
        "the optimizer's update functions left uncompiled",
        ("eager_code", "regression"),
        [("maybe_compile = torch.compile(dynamic=False, fullgraph=True) if COMPILE else (lambda f: f)\n",
          "maybe_compile = lambda f: f  # planted: the optimizer runs eagerly\n")],
        None),
    "fp32_logits": (
        "the loss as plain F.cross_entropy over float32 soft-capped logits (the reference path)",
        ("regression", "over_bound"),
        [("        return kernels.head_loss(x.view(-1, x.size(-1)), self.lm_head.weight, targets.view(-1), "
          "reduction,\n                                 cap=SOFTCAP)\n",
          ("        logits = SOFTCAP * torch.tanh(self.lm_head(x).float() / SOFTCAP)  # planted\n"
           "        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), "
           "reduction=reduction)\n"))],
        None),
    "sync_per_step": (
        "the loss read with .item() once per step, before the optimizer step",
        ("host_sync", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        last_loss = loss.item()  # planted: one sync per step\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "odd_mlp_width": (
        "the MLP's hidden width 4 x width + 1 instead of 4 x width (GEMMs on a misaligned shape)",
        ("over_bound", "regression"),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = 4 * config.n_embd + 1  # planted: not a multiple of 8\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
    "checkpoint_blocks": (
        "activation checkpointing around every block (its forward recomputed in the backward)",
        ("regression", "over_bound"),
        [("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.utils.checkpoint  # planted\n"),
         ("            x = block(x, ve, cos_sin, self.masks[self.window_sizes[i]])\n",
          ("            x = torch.utils.checkpoint.checkpoint(  # planted\n"
           "                block, x, ve, cos_sin, self.masks[self.window_sizes[i]], use_reentrant=False)\n"))],
        None),
    "hidden_host_work": (
        "50 ms of Python work per micro-batch in the input pipeline, nothing else (hidden behind the GPU)",
        (),
        HOST_WORK_50MS,
        None),
    "sync_exposes_host": (
        "hidden_host_work plus the loss read with .item() after each micro-batch's backward: the sync "
        "drains the GPU's queue, so the 50 ms run while the GPU waits (root cause: the sync)",
        ("host_sync",),
        [("                (loss / grad_accum_steps).backward()\n",
          "                (loss / grad_accum_steps).backward()\n"
          "                last_loss = loss.item()  # planted\n")] + HOST_WORK_50MS,
        None),
    # after the rules recompute and misaligned_shapes (2026-11-24): cases none of the rules were written on
    "checkpoint_mlp": (
        "activation checkpointing around the MLP only (its forward recomputed in the backward)",
        ("recompute", "regression"),
        [("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.utils.checkpoint  # planted\n"),
         ("        return x + self.mlp(norm(x))\n",
          "        return x + torch.utils.checkpoint.checkpoint(self.mlp, norm(x), use_reentrant=False)  # planted\n")],
        None),
    "eager_attention": (
        "the attention module excluded from torch.compile (@torch.compiler.disable on its forward)",
        ("graph_break", "eager_code", "regression"),
        [("    def forward(self, x, ve, cos_sin, mask):\n        B, T, C = x.size()\n",
          "    @torch.compiler.disable  # planted\n    def forward(self, x, ve, cos_sin, mask):\n"
          "        B, T, C = x.size()\n")],
        None),
    "clip_grad_sync": (
        "gradient clipping each step with a finiteness check on the host (clip_grad_norm_ + .item())",
        ("host_sync", "eager_code", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # planted\n"
          "        if not math.isfinite(grad_norm.item()):  # planted\n"
          "            raise FloatingPointError('non-finite gradient')\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "eval_forward": (
        "a second forward under torch.no_grad each step (the train loss of the last micro-batch, for logging)",
        ("forward_without_backward", "regression"),
        [("        set_schedules(optimizer, step, progress)\n",
          "        with torch.no_grad(), autocast:  # planted: a no-grad forward each step\n"
          "            forward(x, y)\n"
          "        set_schedules(optimizer, step, progress)\n")],
        None),
    "sync_microbatch": (
        "torch.cuda.synchronize() after every micro-batch's backward",
        ("host_sync", "regression"),
        [("                (loss / grad_accum_steps).backward()\n",
          "                (loss / grad_accum_steps).backward()\n"
          "                torch.cuda.synchronize()  # planted\n")],
        None),
    "mlp_width_1344": (
        "the MLP's hidden width 1344 (8/3 x width rounded down to a multiple of 64): mlp_width_1365's reference",
        (),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = 1344  # planted: 8/3 x 512 rounded to a multiple of 64\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
    "mlp_width_1365": (
        "the MLP's hidden width int(8/3 x width) = 1365 (a SwiGLU-style ratio, not rounded)",
        ("misaligned_shapes", "regression"),
        [("        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)\n"
          "        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)\n",
          ("        hidden = int(8 / 3 * config.n_embd)  # planted: 1365, not a multiple of 8\n"
           "        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)\n"
           "        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)\n"))],
        None),
}



# The earlier plants under issue #33's rule (the `issue33` column; their pass rule stays `result`): the words
# naming each cause, and the planted line where a stack ties the cause to it.
EARLIER_EVIDENCE = {
    "host_sync": dict(words=("item",), line="last_loss = loss.item()  # planted"),
    "nan_check": dict(words=("isnan",), line="if torch.isnan(x).any():  # planted"),
    "fp32_mlp": dict(words=("float32", "fp32", "autocast")),
    "dense_mask": dict(words=("mask",)),
    "small_batch": dict(words=("DEVICE_BATCH_SIZE", "micro-batch")),
    "slow_input": dict(words=("preprocess",), line="while time.perf_counter() - t0 < 0.2:"),
    "shared_gpu": dict(words=("nvidia-smi", "other process")),
    "eager_model": dict(words=("torch.compile",)),
    "eager_optimizer": dict(words=("torch.compile",)),
    "fp32_logits": dict(words=("cross_entropy", "logits", "float32")),
    "sync_per_step": dict(words=("item",), line="last_loss = loss.item()  # planted: one sync per step"),
    "odd_mlp_width": dict(words=("2049",)),
    "checkpoint_blocks": dict(words=("checkpoint",)),
    "sync_exposes_host": dict(words=("item",), line="last_loss = loss.item()  # planted"),
    "checkpoint_mlp": dict(words=("checkpoint",)),
    "eager_attention": dict(words=("compiler.disable",)),
    "clip_grad_sync": dict(words=("item",), line="if not math.isfinite(grad_norm.item()):"),
    "eval_forward": dict(words=("no_grad",)),
    "sync_microbatch": dict(words=("synchronize",), line="torch.cuda.synchronize()  # planted"),
    "mlp_width_1365": dict(words=("1365",), against="mlp_width_1344"),
}
CASES = {name: Case(*spec)._replace(**EARLIER_EVIDENCE.get(name, {})) for name, spec in CASES.items()}


# ---------------------------------------------------------------------------------------------------------
# Issue #33: settings and calls a researcher leaves in train.py, each placed where one would write it
# ---------------------------------------------------------------------------------------------------------

AFTER_IMPORTS = "from profiling import runner\n"   # train.py's last import: process-wide settings go below it


def after_imports(*lines):
    """An edit putting these lines after train.py's imports."""
    return AFTER_IMPORTS, AFTER_IMPORTS + "\n" + "".join(line + "\n" for line in lines)


def env_var(name, value, why):
    """The edits setting an environment variable in train.py before torch is imported (`import os` added)."""
    return [("import math\nimport sys\n", "import math\nimport os  # planted\nimport sys\n"),
            ("\nimport torch\n", f'\nos.environ["{name}"] = "{value}"  # planted: {why}\n\nimport torch\n')]


def import_module(module):
    """The edit importing a torch submodule (a config module) beside train.py's torch imports."""
    return "import torch.nn as nn\n", f"import {module}  # planted\nimport torch.nn as nn\n"


SDP_FLAGS = (
    "torch.backends.cuda.enable_cudnn_sdp(False)  # planted: to compare with the reference attention",
    "torch.backends.cuda.enable_flash_sdp(False)  # planted",
    "torch.backends.cuda.enable_mem_efficient_sdp(False)  # planted")
# kernels.attention runs SDPA inside sdpa_kernel([cuDNN, flash, efficient, math]), which enables the four
# backends whatever the global flags say: the flags reach only a call of F.scaled_dot_product_attention made
# outside it, as a researcher comparing against the reference writes in train.py.
SDPA_DIRECT = (
    "        y = kernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)\n",
    "        if mask is None:  # planted: the full-context layers on plain SDPA, to compare\n"
    "            y = F.scaled_dot_product_attention(\n"
    "                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)\n"
    "        else:\n"
    "            y = kernels.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)\n")

# kinds: the findings package of issue #33 is being written; these kinds are a best guess (GUESS), to edit
# once its rules are named. The check (`issue33`) does not use them: it reads the top finding's evidence.
CASES.update({
    "anomaly_mode": Case(
        "autograd's anomaly detection left on (a global torch mode): the backward checks every function's "
        "output for NaN, a host sync each",
        ("setting", "host_sync", "sync_calls"),  # GUESS
        [after_imports("torch.autograd.set_detect_anomaly(True)  # planted: left on after debugging a NaN")],
        words=("detect_anomaly", "anomaly"), listed=("anomaly",)),
    "launch_blocking": Case(
        "CUDA_LAUNCH_BLOCKING=1 (an environment variable read by CUDA): every kernel launch waits for its "
        "kernel",
        ("blocking_launches", "setting"),  # GUESS
        env_var("CUDA_LAUNCH_BLOCKING", "1", "left on after debugging a CUDA error"),
        words=("CUDA_LAUNCH_BLOCKING",), listed=("CUDA_LAUNCH_BLOCKING",)),
    "deterministic": Case(
        "torch.use_deterministic_algorithms(True) for reproducibility, with the cuBLAS workspace it "
        "requires: a kernel chosen by a setting (the embedding's backward becomes another algorithm)",
        ("setting",),  # GUESS
        env_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8", "cuBLAS requires it for deterministic GEMMs")
        + [after_imports("torch.use_deterministic_algorithms(True)  # planted: for reproducibility")],
        words=("use_deterministic_algorithms", "deterministic"), listed=("deterministic",)),
    "empty_cache": Case(
        "torch.cuda.empty_cache() once per training step, after the optimizer step, to keep memory low: "
        "every cached block freed (cudaFree) and allocated again (cudaMalloc) in the next step",
        ("alloc_churn", "sync_calls"),  # GUESS
        [("        model.zero_grad(set_to_none=True)\n        return loss.detach()\n",
          "        model.zero_grad(set_to_none=True)\n"
          "        torch.cuda.empty_cache()  # planted: keep memory low\n        return loss.detach()\n")],
        words=("empty_cache",), line="torch.cuda.empty_cache()  # planted"),
    "no_caching_allocator": Case(
        "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (an environment variable read by the caching allocator): every "
        "allocation a cudaMalloc, every free a cudaFree",
        ("alloc_churn", "setting"),  # GUESS
        env_var("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", "left on after hunting a memory leak"),
        words=("PYTORCH_NO_CUDA_MEMORY_CACHING",), listed=("PYTORCH_NO_CUDA_MEMORY_CACHING",)),
    "cublas_no_workspace": Case(
        "CUBLAS_WORKSPACE_CONFIG=:0:0 (an environment variable read by cuBLAS): GEMMs without a workspace "
        "(may cost little: then it is a quiet case)",
        ("setting", "over_bound"),  # GUESS
        env_var("CUBLAS_WORKSPACE_CONFIG", ":0:0", "deterministic cuBLAS without a workspace"),
        words=("CUBLAS_WORKSPACE_CONFIG",), listed=("CUBLAS_WORKSPACE_CONFIG",)),
    "sdp_math": Case(
        "SDPA's cuDNN, flash and memory-efficient backends disabled (backends flags) and the full-context "
        "layers on plain F.scaled_dot_product_attention, to compare against the reference attention: their "
        "attention falls to the math path (a [T, T] score matrix per head; the window layers stay on cuDNN)",
        ("attention_fallback", "setting"),  # GUESS
        [after_imports(*SDP_FLAGS), SDPA_DIRECT],
        words=("enable_math_sdp", "enable_flash_sdp", "enable_cudnn_sdp", "sdp"), listed=("sdp",)),
    "memory_budget": Case(
        "torch._functorch.config.activation_memory_budget = 0.5 to keep memory low (a compiler setting): the "
        "partitioner recomputes activations in the backward",
        ("recompute", "setting"),  # GUESS
        [import_module("torch._functorch.config"),
         after_imports("torch._functorch.config.activation_memory_budget = 0.5  # planted: keep memory low")],
        words=("activation_memory_budget",), listed=("activation_memory_budget",)),
    "nan_asserts": Case(
        "torch._inductor.config.nan_asserts = True left on after debugging (a compiler setting): the "
        "compiled graphs check their buffers for NaN on the host",
        ("setting", "host_sync", "sync_calls"),  # GUESS
        [import_module("torch._inductor.config"),
         after_imports("torch._inductor.config.nan_asserts = True  # planted: left on after a NaN hunt")],
        words=("nan_asserts",), listed=("nan_asserts",)),
    # quiet cases: a setting expected to cost nothing here (no finding; the header lists the setting)
    "fp32_highest": Case(
        'torch.set_float32_matmul_precision("highest") instead of train.py\'s "high" (a global torch mode): '
        "costs nothing if every GEMM runs in bf16; torch's default, so the header lists train.py's choice no "
        "more",
        (),
        [('        torch.set_float32_matmul_precision("high")\n',
          '        torch.set_float32_matmul_precision("highest")  # planted: full float32 precision\n')],
        words=("float32_matmul_precision",)),
    "cudnn_benchmark": Case(
        "torch.backends.cudnn.benchmark = True (a backends flag): no convolution here, so it costs nothing",
        (),
        [after_imports("torch.backends.cudnn.benchmark = True  # planted: the usual speed-up line")],
        words=("cudnn.benchmark",), listed=("cudnn.benchmark",)),
    "expandable_segments": Case(
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (an allocator environment variable): expected to "
        "cost nothing",
        (),
        env_var("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "as the OOM message advises"),
        words=("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments"), listed=("expandable_segments",)),
    # capture-only variants (in no group): sdp_math's flags alone, which kernels.attention overrides (a
    # setting that differs and costs nothing), and its lower-memory form should the math path not fit
    "sdp_flags_only": Case(
        "sdp_math's three backends flags alone: kernels.attention's own backend list overrides them, so they "
        "cost nothing",
        (),
        [after_imports(*SDP_FLAGS)],
        words=("sdp",), listed=("sdp",)),
    "sdp_efficient": Case(
        "sdp_math with the memory-efficient backend left on: the full-context layers on SDPA's "
        "memory-efficient kernels instead of cuDNN's",
        ("attention_fallback", "setting"),  # GUESS
        [after_imports(*SDP_FLAGS[:2]), SDPA_DIRECT],
        words=("enable_flash_sdp", "enable_cudnn_sdp", "sdp"), listed=("sdp",)),
    # a last device call (issue #33): more settings of other kinds
    "alloc_gc_threshold": Case(
        "PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.3 (an allocator environment variable): the "
        "caching allocator gives cached blocks back whenever more than 30% of the GPU is in use (measured on the "
        "H100, 2026-11-25: no cost, a quiet case)",
        (),
        env_var("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.3", "to keep memory low"),
        words=("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold"), listed=("garbage_collection",)),
    "cudnn_disabled": Case(
        "torch.backends.cudnn.enabled = False (a backends flag): SDPA's cuDNN attention is off for the "
        "full-context layers (measured: no cost, kernels.attention keeps its backends; a quiet case)", (),
        [after_imports("torch.backends.cudnn.enabled = False  # planted: for reproducibility")],
        words=("cudnn.enabled",), listed=("cudnn.enabled",)),
    "bf16_full_reduction": Case(
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False (a backends flag): bf16 "
        "GEMMs reduce in float32 (measured: no cost; a quiet case)", (),
        [after_imports("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # planted: "
                       "accuracy")],
        words=("allow_bf16_reduced_precision_reduction",), listed=("allow_bf16_reduced_precision_reduction",)),
    # a last device call (issue #33): a compiler setting, the driver's allocator, a global mode that costs nothing
    # (autograd's save_on_cpu was dropped: under torch.compile 2.11 its unpacked tensors fail the compiled
    # backward's stride asserts, a crash, no slowdown)
    "sync_kernels": Case(
        "torch._inductor.config.triton.debug_sync_kernel = True left on after locating a CUDA error (a "
        "compiler setting): the compiled graphs synchronize after every kernel",
        ("setting",),  # GUESS
        [import_module("torch._inductor.config"),
         after_imports("torch._inductor.config.triton.debug_sync_kernel = True  # planted: locate a CUDA error")],
        words=("debug_sync_kernel",), listed=("debug_sync_kernel",)),
    "malloc_async": Case(
        "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (an allocator environment variable): the driver's "
        "stream-ordered allocator instead of the caching allocator (measured on the H100, 2026-11-25: no cost, "
        "a quiet case)",
        (),
        env_var("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", "the driver's allocator"),
        words=("cudaMallocAsync", "PYTORCH_CUDA_ALLOC_CONF"), listed=("cudaMallocAsync",)),
    "sync_debug_warn": Case(
        'torch.cuda.set_sync_debug_mode("warn") left on after looking for hidden syncs (a global torch mode): '
        "a warning at each synchronizing call; the step has few",
        (),
        [after_imports('torch.cuda.set_sync_debug_mode("warn")  # planted: find hidden syncs')],
        words=("sync_debug_mode",), listed=("sync_debug_mode=warn",)),
    # the compile cache (issue #33, item 5): run in this order, both with the machine's default Inductor cache
    # (diagnoses.SHARED_INDUCTOR_CACHE): the second, a line added at the top, gets the first one's graphs
    "cache_first": Case("nothing: the default train.py, compiled into the shared Inductor cache", (), []),
    "cache_shifted": Case(
        "a comment line added at the top of train.py, compiled graphs from the shared cache (cache_first's): "
        "its lines must name its own folder and the shifted line numbers", (),
        [('"""\nAutoresearch pretraining script.', '# planted: one line more at the top\n"""\nAutoresearch '
          'pretraining script.')]),
})


def logged_loss(ms):
    """The edits of a per-micro-batch log: the loss read with .item() (a host sync) and `ms` ms of Python
    formatting it, so the GPU idles about that long per micro-batch (the clock cases)."""
    return [("                (loss / grad_accum_steps).backward()\n",
             "                (loss / grad_accum_steps).backward()\n"
             "            log_loss(loss.item())  # planted\n"),
            ("def make_train_step(", ("def log_loss(value):  # planted: a log line per micro-batch\n"
                                     "    t0 = time.perf_counter()\n"
                                     f"    while time.perf_counter() - t0 < {ms / 1000}:\n"
                                     "        pass\n\n\ndef make_train_step(")),
            ("import math\n", "import math\nimport time  # planted\n")]


# The GPU idle at several levels, to test the clock correction of idle findings (a GPU that idles holds higher
# clocks under its power limit than a busy one: profiling/profile/findings/__init__.py): a per-micro-batch
# log, 2 micro-batches per step
CASES.update({f"log_{ms}ms": Case(
    f"the loss read with .item() and logged with {ms} ms of Python after every micro-batch's backward (the GPU "
    f"idles while the host logs: a clock case)",
    ("host_sync",), logged_loss(ms), words=("item",), line="log_loss(loss.item())  # planted")
    for ms in (10, 40, 100)})

# two device calls of at most 10 minutes, each with its own baseline: --cases baseline,new1 / baseline,new2
NEW_CASES = ("anomaly_mode", "launch_blocking", "deterministic", "empty_cache", "no_caching_allocator",
             "cublas_no_workspace", "sdp_math", "memory_budget", "nan_asserts", "fp32_highest",
             "cudnn_benchmark", "expandable_segments")
CLOCK_CASES = ("launch_blocking", "sync_kernels", "log_10ms", "log_40ms", "log_100ms")
# issue #33's plants, costly ones first: one warm machine, calls with --skip-existing until all are in
ISSUE33 = ("nan_asserts", "launch_blocking", "sync_kernels", "anomaly_mode", "empty_cache", "no_caching_allocator",
           "deterministic", "memory_budget", "sdp_math", "sdp_efficient", "cublas_no_workspace", "eager_attention",
           "eager_model", "cache_first", "cache_shifted", "fp32_highest", "cudnn_benchmark", "expandable_segments",
           "alloc_gc_threshold", "cudnn_disabled", "bf16_full_reduction", "malloc_async", "sync_debug_warn")
GROUPS = {"all": tuple(CASES), "new": NEW_CASES, "new1": NEW_CASES[:6], "new2": NEW_CASES[6:],
          "clock": CLOCK_CASES, "issue33": ISSUE33}


def expand(names):
    """Case names from a comma-separated list of case and group names; SystemExit naming unknown ones."""
    if not names:
        return list(CASES)
    cases = []
    for name in names.split(","):
        for case in GROUPS.get(name.strip(), (name.strip(),)):
            if case not in cases:
                cases.append(case)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"diagnoses: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}; "
                 f"groups: {', '.join(GROUPS)}")
    return cases


# ---------------------------------------------------------------------------------------------------------
# plant and check (anywhere)
# ---------------------------------------------------------------------------------------------------------

class PlantError(Exception):
    pass


def plant(case, source):
    """train.py's text with the case's edits applied; SystemExit when an edit's text is missing."""
    try:
        return apply_plant(case, source)
    except PlantError as e:
        sys.exit(f"diagnoses: {e}")


def apply_plant(case, source):
    for old, new in CASES[case].edits:
        if source.count(old) != 1:
            raise PlantError(f"case {case}: the text to replace is in train.py {source.count(old)} times "
                             f"(expected once): {old.strip()[:60]!r}; update CASES")
        source = source.replace(old, new)
    return source


def line_number(case, source):
    """The 1-based number of the case's `line` in the planted source (None: the case names none)."""
    marker = CASES[case].line
    if not marker:
        return None
    found = [i for i, text in enumerate(source.splitlines(), 1) if marker in text]
    if len(found) != 1:
        raise PlantError(f"case {case}: its line {marker!r} is in the planted train.py {len(found)} times "
                         "(expected once)")
    return found[0]


MODULES = ("os", "time", "torch", "kernels", "runner", "math", "gc", "sys", "nn", "F")


def _imports(node, module):
    if isinstance(node, ast.Import):
        return any(a.name == module or a.name.startswith(module + ".") for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == module


def check_source(case, source):
    """PlantError when the planted source does not compile, uses a module it does not import, or sets an
    environment variable after torch is imported (CUDA, cuBLAS and the allocator read them at start)."""
    try:
        compile(source, f"{case}/train.py", "exec")
        tree = ast.parse(source)
    except SyntaxError as e:
        raise PlantError(f"case {case}: the planted train.py does not parse: {e}") from None
    imported = {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    used = {n.value.id for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    if set(MODULES) & used - imported:
        raise PlantError(f"case {case}: the planted train.py uses {sorted(set(MODULES) & used - imported)} "
                         "without importing it")
    body = tree.body
    torch_at = next((i for i, n in enumerate(body) if _imports(n, "torch")), len(body))
    os_at = next((i for i, n in enumerate(body) if _imports(n, "os")), len(body))
    for i, n in enumerate(body):
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) or os_at < i < torch_at:
            continue
        if any(isinstance(x, ast.Attribute) and x.attr == "environ" for x in ast.walk(n)):
            raise PlantError(f"case {case}: train.py:{n.lineno} uses os.environ after torch is imported or "
                             "before os is")
