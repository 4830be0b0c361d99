"""Case 5 of benchmarks/findings/live/host_side.py (issue #48): Lightning DDP of a host-bound bf16 model on 2
devices, each rank's own step times recorded, unprofiled and under profiling.LightningCallback; and the ranks'
statistics.

    lightning_ddp(variant, size, device, args, steps, work) -> (rank, records, profile folder or None, info)
    ddp_stats(parts) -> the variant's entry of host_side.json (per rank: medians; how late to backward)

A straggler makes the others wait in the collectives: in DDP the gradient all-reduce runs inside backward, so
the rank that reaches backward last, step after step, is the one the others wait for (their backward grows by
that wait). The statistics put that side by side for the profiled window and for the unprofiled steps.
"""
import os
import statistics

import torch
import torch.nn.functional as F
from torch import nn

DDP_VARIANTS = ("unprofiled", "profiled")


def lightning_ddp(variant, size, device, args, steps, work):
    """Train a residual MLP with small batches (the host's launches dominate) under Lightning, strategy="ddp",
    precision "bf16-mixed", on args.devices devices, for `steps` optimizer steps; the profiled variant adds
    profiling.LightningCallback (its Profiler from the first batch). Every rank records each step's host
    timestamps (CLOCK_MONOTONIC: one clock for the ranks of one host) at the batch's start, before and after
    backward (DDP's all-reduce runs inside backward) and at its end, and a CUDA event at the end. Returns
    (rank, [per-step records], the profile's folder or None, model info)."""
    import lightning as L

    import profiling
    width, depth, batch = (256, 24, 32) if size == "gpu" else (16, 2, 4)
    module = _host_bound_module(L, width, depth)
    n = steps * batch * args.devices
    data = torch.utils.data.TensorDataset(torch.randn(n, width), torch.randn(n))
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    prof = profiling.LightningCallback(out_dir=os.path.join(work, "profiles", f"lightning_ddp-{variant}")) \
        if variant == "profiled" else None
    timer = _step_timer(L, prof, device)
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=args.devices,
                        strategy="ddp", precision="bf16-mixed", max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=os.path.join(work, "lightning"), num_sanity_val_steps=0,
                        callbacks=[c for c in (prof, timer) if c is not None])  # the timer after the profile
    trainer.fit(module, loader)
    info = {"model": f"residual MLP {depth} x Linear({width}, {width}) + LayerNorm + GELU",
            "batch_per_rank": batch, "devices": args.devices, "precision": "bf16-mixed", "strategy": "ddp",
            "lightning": L.__version__}
    return trainer.global_rank, timer.records, prof.folder if prof else None, info


def _host_bound_module(L, width, depth):
    class HostBound(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                        for _ in range(depth))
            self.head = nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            for block in self.blocks:
                x = x + block(x)
            return F.mse_loss(self.head(x).squeeze(-1).float(), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)
    return HostBound()


def _step_timer(L, prof, device):
    """A Callback recording each step's host timestamps (s, CLOCK_MONOTONIC), whether the profile was running
    in it, and a CUDA event at its end (the device timeline's step, read at train end)."""
    import time

    def now():
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    class StepTimer(L.Callback):
        def __init__(self):
            self.records, self.events = [], []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            profiled = bool(prof is not None and prof.run is not None and not prof.run.prof.done)
            self.records.append({"start": now(), "profiled": profiled})

        def on_before_backward(self, trainer, pl_module, loss):
            self.records[-1]["before_backward"] = now()

        def on_after_backward(self, trainer, pl_module):
            self.records[-1]["after_backward"] = now()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.records[-1]["end"] = now()
            if device.type == "cuda":
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                self.events.append(event)

        def on_train_end(self, trainer, pl_module):
            if self.events:
                torch.cuda.synchronize()
                for r, a, b in zip(self.records[1:], self.events, self.events[1:]):
                    r["event_ms"] = a.elapsed_time(b)
    return StepTimer()


PHASES = {  # name -> (from, to) of a step's host timestamps
    "forward_ms": ("start", "before_backward"),
    "backward_ms": ("before_backward", "after_backward"),  # the all-reduce, and any wait for a later rank
    "optimizer_ms": ("after_backward", "end"),  # the update and the batch-end callbacks (the profiler's step)
}


def ddp_stats(parts):
    """The ranks' parts merged: per rank and window (the profiled steps; the unprofiled ones after the
    warm-up), median ms of the host step (end to end), the CUDA-event step, each phase, and `late_ms`: how
    long after the earliest rank it reached backward (the straggler's is > 0 step after step)."""
    parts = sorted(parts, key=lambda p: p["rank"])
    first = parts[0]
    out = {k: first.get(k) for k in ("case", "variant", "size", "torch", "device", "info", "profile")}
    windows = _windows(first["records"], first["warmup_steps"])
    out["windows"] = {w: [_rank_stats(p, parts, idx) for p in parts] for w, idx in windows.items() if idx}
    out["records"] = {f"rank{p['rank']}": p["records"] for p in parts}
    after = out["windows"].get("unprofiled") or []
    out["ranks_summary"] = "unprofiled steps: " + "; ".join(
        f"rank {r['rank']} step {r['step_ms']} ms (fwd {r['forward_ms']}, bwd {r['backward_ms']}, opt "
        f"{r['optimizer_ms']}, late to backward {r['late_ms']})" for r in after)
    if after:
        out["ms_per_step_median"] = max(r["step_ms"] for r in after)
    return out


def _windows(records, warmup):
    """Step indices of the profiled window and of the unprofiled steps after it (and after the warm-up)."""
    profiled = [i for i, r in enumerate(records) if r.get("profiled")]
    start = (profiled[-1] + 1 if profiled else 0) + warmup
    return {"profiled": profiled,
            "unprofiled": [i for i in range(start, len(records)) if "end" in records[i]]}


def _rank_stats(part, parts, idx):
    recs = part["records"]
    idx = [i for i in idx if i > 0 and all(len(p["records"]) > i for p in parts)]
    row = {"rank": part["rank"], "steps": len(idx),
           "step_ms": _med(1e3 * (recs[i]["end"] - recs[i - 1]["end"]) for i in idx),
           "event_ms": _med(recs[i].get("event_ms") for i in idx)}
    for name, (a, b) in PHASES.items():
        row[name] = _med(1e3 * (recs[i][b] - recs[i][a]) for i in idx if a in recs[i] and b in recs[i])
    first = {i: min(p["records"][i]["before_backward"] for p in parts) for i in idx}
    row["late_ms"] = _med(1e3 * (recs[i]["before_backward"] - first[i]) for i in idx)
    return row


def _med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None
