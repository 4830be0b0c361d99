"""Stage 3, pure: the step budget's tables and their measures: the model's regions, source lines (compiled and
eager), the roofline and bound, GPU memory, CUDA calls, the attention kind, the optimizer's own time."""
