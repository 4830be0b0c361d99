"""Regenerate tests/data/cpu-compiled-gpt-2steps.trace.json.gz: `train.py --profile` of our own GPT, compiled,
on the CPU, with the source-line record of its compiled kernels (profiling/profile/capture/provenance.py).

    uv run python tests/data/make_cpu_compiled_trace.py

As make_cpu_gpt_trace.py (the cpu preset: MAX_SEQ_LEN 256, VOCAB 512; 1 warm-up + 2 active steps), but the
model is compiled as on CUDA (train.COMPILE forced on; the optimizer stays eager), so the trace holds the
compiled graphs' `## Call CompiledFxGraph` annotations, their C++ kernels (`graph_0_cpp_fused_...`) and
`autoresearch.provenance`. Compiling takes a few minutes on 2 cores. Deterministic in shape, not in timings.
"""
import gzip
import os
import shutil
import sys
import tempfile

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu-compiled-gpt-2steps.trace.json.gz")


def main():
    tmp = tempfile.mkdtemp()
    os.environ.update(AUTORESEARCH_PRESET="cpu", AUTORESEARCH_VOCAB_SIZE="512",
                      AUTORESEARCH_CACHE=os.path.join(tmp, "cache"),
                      AUTORESEARCH_PROFILE_DIR=os.path.join(tmp, "profiles"),
                      AUTORESEARCH_MEMORY=os.path.join(tmp, "experiments.json"),
                      TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
    sys.path.insert(0, os.getcwd())
    import prepare  # reads the environment at import
    import train
    from profiling.profile.capture import provenance

    train.COMPILE = True  # the model only: make_train_step reads it when it runs
    prepare.prepare("builtin", cache=os.environ["AUTORESEARCH_CACHE"])
    cwd = os.getcwd()
    provenance.start(root=cwd)  # file names relative to the repository, as when run from it
    os.chdir(tmp)
    try:
        assert train.main(["--profile", "--warmup-steps", "1", "--active-steps", "2"]) == 0
    finally:
        os.chdir(cwd)
    profiles = os.environ["AUTORESEARCH_PROFILE_DIR"]
    with gzip.open(os.path.join(profiles, "latest", "trace.json.gz"), "rb") as src, \
            gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as dst:  # the capture writes level 1
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
