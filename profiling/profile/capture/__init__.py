"""Stage 1, inside the training process: the profiled window, the untimed steps after it (shapes, eager lines, GPU
memory), the host's stack sampler, the compiler's source-line record, NVML and the process's settings. The only
stage that imports torch or NVML; it exports a Chrome trace with its metadata and never reads one back."""
