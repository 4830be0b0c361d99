"""The research memory: what was tried, what it gave, and what to try next.

`experiments` owns experiments.json (validated, locked, written atomically; never overwritten when it
cannot be read). The pure modules read its records: `history` (baselines, new records from a run.json, the
noise floor, stagnation), `ucb1` (which dimension next), `gate` (the early-abort decision train.py asks
for at 30% of its budget), `tsv` (results.tsv in and out) and `report` (the morning report's numbers).
`render` turns them into the commands' text and tables, `plot` into progress.png, and `cli_report` is
`research report`; the other subcommands live in profiling/cli.py.
"""
