"""Stage 2, pure: a Chrome trace read into indexed events, steps and iterations, kernel classes, device peaks, the
timeline's gaps and syncs, the recorded GPU state and settings, and whose code a source frame is."""
