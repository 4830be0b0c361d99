"""Profiler and research memory for autoresearch, in two wings under one `research` CLI.

- `profiling.profile`: the step profile (capture -> trace -> summary -> findings -> report).
- `profiling.research`: the research memory (experiments.json, UCB1, the early-abort gate, the rescue
  pool, results.tsv, the morning report).
- At the top, what both use or what joins them: `cli` (the `research` command), `runner` (train.py's run
  plumbing: flags, run.json, the gate and the profile), `runfile` (run.json), `files` (atomic writes) and
  `errors`. The wings never import each other; only `cli` and `runner` import both.

Everything here except `profile.capture` and `runner` is pure Python and never imports torch.
"""
