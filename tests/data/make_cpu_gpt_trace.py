"""Regenerate tests/data/cpu-gpt-2steps.trace.json.gz: `train.py --profile` of our own GPT on the CPU.

    uv run python tests/data/make_cpu_gpt_trace.py

The real code path at test scale (the cpu preset: MAX_SEQ_LEN 256, VOCAB 512; eager model, no compile):
profiling.profile.capture.window records 1 warm-up + 2 active steps with record_shapes=True, and train.py writes its
parameter shapes into the trace metadata. The builtin corpus and tokenizer are prepared in a temp dir.
Deterministic in shape (op names, counts and input shapes), not in timings.
"""
import gzip
import os
import shutil
import tempfile

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu-gpt-2steps.trace.json.gz")


def main():
    tmp = tempfile.mkdtemp()
    os.environ.update(AUTORESEARCH_PRESET="cpu", AUTORESEARCH_VOCAB_SIZE="512",
                      AUTORESEARCH_CACHE=os.path.join(tmp, "cache"),
                      AUTORESEARCH_PROFILE_DIR=os.path.join(tmp, "profiles"),
                      AUTORESEARCH_MEMORY=os.path.join(tmp, "experiments.json"))
    import prepare  # reads the environment at import
    import train

    prepare.prepare("builtin", cache=os.environ["AUTORESEARCH_CACHE"])
    cwd = os.getcwd()
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
