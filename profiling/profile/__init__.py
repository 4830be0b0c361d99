"""The step profile: where each training step's time goes on the device, as a report an agent reads.

Five stages, each a folder that imports only the ones below it (README.md here says what goes where):
`capture` (in the training process: the profiled window, the untimed steps after it, the only stage with torch)
exports a Chrome trace; `trace` reads and indexes it; `tables` measures the step (regions, lines, roofline,
bound, memory, CUDA calls); `findings` names the causes with evidence, gain and fix; `report` makes the summary,
the Markdown and JSON, the profile folder and `research profile`.
"""
