"""The step profile: where each training step's time goes on the device, as a report an agent reads.

Data flows one way. `capture` (the only module that drives torch.profiler) profiles a few steps of a live
run, with `sampler` (the host's Python stack), `provenance` (which lines each compiled kernel came from) and
`whose` (which frames are the user's code or installed model code) beside it, and `shapes` (operator input
shapes recorded in an untimed step, lent to the profiled steps' operators), and exports a Chrome trace;
`irregular` names outlier steps and a loop that ended early. `traceio` and `timeline` read and index any such trace;
`classify` names kernels and their categories; `summary` makes the per-step numbers, with `closures` (the
optimizer's own work, not a closure's forward and backward run in optimizer.step), `regions` (the model's
parts), `roofline` (FLOPs and bytes against the device's peaks, `hardware`), `lines` (time per source line)
and `kernel_match` (kernels matched across recompiles for diffs);
the `findings` package turns the summary into causes with evidence, gain and fix; `render` writes the Markdown
report and its JSON twin. `cli_profile` is `research profile TRACE`, the same path on a saved trace.
`ranks` reads a profile folder of several ranks (torchrun: `rank-<k>.trace.json.gz`, HTA's `rank-<k>.json`, or
tensorboard_trace_handler's `<worker>.<time_ns>.pt.trace.json`)
into one result: rank 0's summary, a row per rank (step, compute, communication, exposed communication, idle),
the skew between ranks and the `exposed_communication` and `straggler` findings (`summarize_folder(folder)`).
"""
