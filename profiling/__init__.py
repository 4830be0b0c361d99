"""Profiler and research memory for autoresearch, in two wings under one `research` CLI.

- `profiling.profile`: the step profile (capture -> trace -> summary -> findings -> report).
- `profiling.research`: the research memory (experiments.json, UCB1, the early-abort gate, the rescue
  pool, results.tsv, the morning report).
- At the top, what both use or what joins them: `cli` (the `research` command), `runner` (train.py's run
  plumbing: flags, run.json, the gate and the profile), `runfile` (run.json), `files` (atomic writes) and
  `errors`. The wings never import each other; only `cli` and `runner` import both.

The public profiling API (profiling/api.py): `Profiler`, `profile_steps`, `ProfileResult`, and the framework
callbacks (profiling/callbacks.py): `HFCallback` (Hugging Face Trainer), `LightningCallback` (Lightning),
importable from here without importing torch or the frameworks (they load on first use).

Everything here except `api`, `callbacks`, `profile.capture` and `runner` is pure Python and never imports torch.
"""

__all__ = ["HFCallback", "LightningCallback", "ProfileResult", "Profiler", "profile_steps"]


def __getattr__(name):
    if name in ("HFCallback", "LightningCallback"):
        from profiling import callbacks
        return getattr(callbacks, name)
    if name in __all__:
        from profiling import api
        return getattr(api, name)
    raise AttributeError(f"module 'profiling' has no attribute {name!r}")
