"""How the findings' time grows with the syncs a step makes: a synthetic trace shaped like Inductor's NaN asserts
(torch._inductor.config.nan_asserts: inside a compiled graph's call, per buffer a kernel, then .item(): a copy and
a stream sync, the GPU idle meanwhile; 5,312 syncs a step on the H100 plant of issue #33), summarized whole.

    uv run python benchmarks/report_speed/many_syncs.py [--syncs 500,1000,2000,4000] [--steps 3]

Prints, per size, the seconds `summarize` takes (one run each; the results file says where and when). Linear is
the goal: the profile of a run with nan_asserts on hung in the findings (a scan of every sync per GPU gap).
"""
import argparse
import time

from profiling.profile.report.summary import summarize


def x(cat, name, ts, dur, corr=None, pid=1, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {}}
    if corr is not None:
        e["args"] = {"correlation": corr} if pid == 1 else {"correlation": corr, "stream": 7}
    return e


def trace(steps, syncs):
    """`steps` profiled steps of `syncs` checked buffers each (60 us per buffer, 100 us between steps)."""
    events, corr, t = [], 100, 0.0
    for k in range(steps):
        start = t
        events.append(x("cpu_op", "## Call CompiledFxGraph synthetic ##", t + 4, syncs * 60 + 2))
        for i in range(syncs):
            events += [x("cpu_op", "aten::isnan", t + 5, 8),
                       x("cuda_runtime", "cudaLaunchKernel", t + 6, 4, corr),
                       x("kernel", f"triton_poi_fused_add_{i % 50}", t + 10, 20, corr, pid=0, tid=7),
                       x("cpu_op", "aten::item", t + 14, 40),
                       x("cpu_op", "aten::_local_scalar_dense", t + 15, 38),
                       x("cuda_runtime", "cudaMemcpyAsync", t + 16, 3, corr + 1),
                       x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t + 31, 2, corr + 1, pid=0, tid=7),
                       x("cuda_runtime", "cudaStreamSynchronize", t + 20, 14, corr + 2)]
            corr, t = corr + 3, t + 60
        t += 100
        events.append(x("user_annotation", f"ProfilerStep#{k}", start, t - start))
    return {"traceEvents": events}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--syncs", default="500,1000,2000,4000", help="syncs per step, comma-separated")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    print("| syncs/step | events | summarize s | top finding |\n|---|---|---|---|")
    for n in (int(v) for v in args.syncs.split(",")):
        t = trace(args.steps, n)
        t0 = time.perf_counter()
        s = summarize(t)
        top = s["findings"][0]["kind"] if s["findings"] else "none"
        print(f"| {n} | {len(t['traceEvents'])} | {time.perf_counter() - t0:.2f} | {top} |", flush=True)


if __name__ == "__main__":
    main()
