"""profiling.profile.report.ranks: a profile folder of per-rank traces -> one result. On the recorded 2-rank CPU DDP
fixtures (tests/data/make_cpu_ddp_trace.py) and on small synthetic GPU traces computed by hand."""
import gzip
import json
import os
import shutil

import pytest

from profiling.cli import main
from profiling.errors import UserError
from profiling.profile.report import render
from profiling.profile.report.ranks import summarize_folder
from profiling.profile.report.summary import load_trace, summarize
from profiling.profile.trace.classify import classify_cpu_op, classify_kernel

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
BALANCED = os.path.join(DATA, "cpu-ddp-2ranks")
STRAGGLER = os.path.join(DATA, "cpu-ddp-straggler")
COMM = os.path.join(DATA, "cpu-ddp-comm")
CPU = os.path.join(DATA, "cpu-tiny-mlp-3steps.trace.json.gz")
EXTRA_SHAPE = [[1024, 1024], [1024, 1024]]  # the straggler's extra matmuls (make_cpu_ddp_trace.py, rank 1)
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.fixture(scope="module")
def results():
    return {name: summarize_folder(path) for name, path in
            (("balanced", BALANCED), ("straggler", STRAGGLER), ("comm", COMM))}


def finding(result, kind):
    return next((f for f in result["findings"] if f["kind"] == kind), None)


# ---------------------------------------------------------------------------------------------------------
# Categories

def test_collectives_are_communication():
    assert classify_kernel(NCCL) == "communication"
    assert classify_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)") == "communication"
    for op in ("c10d::allreduce_", "gloo:all_reduce", "record_param_comms", "_c10d_functional::wait_tensor"):
        assert classify_cpu_op(op) == "communication", op
    assert classify_cpu_op("torch::distributed::reducer::mul_out") == "other compute"  # DDP's own arithmetic
    assert classify_cpu_op("aten::mm") == "GEMM"


def test_single_process_summary_has_no_communication_part():
    s = summarize(load_trace(CPU))
    assert "communication" not in s["categories"] and "ranks" not in s
    assert all(r["region"] != "communication" for r in s["regions"]["rows"])


# ---------------------------------------------------------------------------------------------------------
# The folder

def test_both_namings_and_the_single_trace_folder(tmp_path, results):
    hta = tmp_path / "hta"
    hta.mkdir()
    shutil.copy(os.path.join(BALANCED, "rank-0.trace.json.gz"), hta / "rank-0.json.gz")
    with gzip.open(os.path.join(BALANCED, "rank-1.trace.json.gz"), "rb") as f:
        (hta / "rank-1.json").write_bytes(f.read())
    r = summarize_folder(str(hta))
    assert r["world_size"] == 2 and [x["rank"] for x in r["ranks"]] == [0, 1]
    assert r["ranks"] == results["balanced"]["ranks"]
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(CPU, single / "trace.json.gz")
    assert summarize_folder(str(single)) == summarize(load_trace(CPU))


def test_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(UserError, match="no traces in this folder; expected rank-<k>.trace.json.gz.*"
                                        r"<worker>.<time>.pt.trace.json\[.gz\] \(as tensorboard_trace_handler"):
        summarize_folder(str(tmp_path))
    for k in (0, 2):
        shutil.copy(os.path.join(BALANCED, "rank-0.trace.json.gz"), tmp_path / f"rank-{k}.trace.json.gz")
    with pytest.raises(UserError, match=r"no trace for rank 1 \(found rank 0, 2\)") as e:
        summarize_folder(str(tmp_path))
    assert "\n" not in str(e.value)
    (tmp_path / "rank-2.trace.json.gz").rename(tmp_path / "rank-0.json")
    with pytest.raises(UserError, match="two traces for rank 0"):
        summarize_folder(str(tmp_path))
    (tmp_path / "rank-0.json").unlink()
    trace = load_trace(os.path.join(BALANCED, "rank-0.trace.json.gz"))
    trace["autoresearch"]["world_size"] = 3
    (tmp_path / "rank-0.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    with pytest.raises(UserError, match="the run had 3 ranks"):
        summarize_folder(str(tmp_path))


# ---------------------------------------------------------------------------------------------------------
# The recorded CPU fixtures

@pytest.mark.parametrize("name", ["balanced", "straggler", "comm"])
def test_rows_add_up_and_reach_the_json(results, name):
    r = results[name]
    assert r["world_size"] == 2 and r["report_rank"] == 0 and r["kind"] == "cpu"
    for row in r["ranks"]:
        assert row["compute_ms"] + row["exposed_comm_ms"] + row["idle_ms"] == pytest.approx(row["step_ms"], abs=1e-3)
        assert 0 < row["exposed_comm_ms"] <= row["comm_ms"]
        assert row["collectives"][0]["name"] == "gloo:all_reduce" and row["collectives"][0]["bytes"] > 0
    assert r["step_ms"] == r["ranks"][0]["step_ms"]  # the sections are rank 0's
    data = json.loads(render.to_json(r))
    assert data["world_size"] == 2
    assert set(data["ranks"][1]) >= {"rank", "step_ms", "comm_ms", "exposed_comm_ms", "idle_ms"}


def test_balanced_run_has_no_rank_finding(results):
    r = results["balanced"]
    for kind in ("straggler", "exposed_communication"):
        f = finding(r, kind)
        assert f is None or f["ms_per_step"] < 0.01 * r["step_ms"], f


def extra_ms(path):
    """ms/step of the straggler's extra matmuls, measured in its own trace."""
    trace = load_trace(path)
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")]
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"
          and (e.get("args") or {}).get("Input Dims") == EXTRA_SHAPE and any(a <= e["ts"] <= b for a, b in steps)]
    return sum(e["dur"] for e in mm) / len(steps) / 1e3


def test_straggler_names_rank_1_with_its_extra_time(results):
    r = results["straggler"]
    f = finding(r, "straggler")
    extra = extra_ms(os.path.join(STRAGGLER, "rank-1.trace.json.gz"))
    assert f is not None and f["evidence"].startswith("rank 1 works")
    assert r["skew"]["straggler"] == 1 and r["skew"]["grew"][0]["part"] == "GEMM"
    # its extra matmuls, and the noise of the host that recorded it (ranks of the balanced run: 9% of the step)
    assert extra <= f["ms_per_step"] <= extra + 0.1 * r["step_ms"]
    assert r["findings"].index(f) < len(r["findings"])  # sorted with the others
    assert [x["ms_per_step"] for x in r["findings"]] == sorted((x["ms_per_step"] for x in r["findings"]), reverse=True)


def test_comm_bound_run_has_exposed_communication(results):
    r = results["comm"]
    f = finding(r, "exposed_communication")
    assert f is not None and f["ms_per_step"] >= 0.01 * r["step_ms"]
    assert f["ms_per_step"] == pytest.approx(min(x["exposed_comm_ms"] for x in r["ranks"]), abs=0.01)
    assert "gloo:all_reduce x" in f["evidence"] and "MB/step in all" in f["evidence"]


def test_cli_reads_a_folder(capsys):
    assert main(["profile", STRAGGLER, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "rank 0 of 2" in out and "## Ranks (2): the step on each rank" in out
    assert "**straggler**" in out and "| 1      |" in out
    assert main(["profile", COMM, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 2 and len(data["ranks"]) == 2


# ---------------------------------------------------------------------------------------------------------
# A folder of tensorboard_trace_handler files: <worker>.<time_ns>.pt.trace.json[.gz]

@pytest.fixture(scope="module")
def balanced_traces():
    return [load_trace(os.path.join(BALANCED, f"rank-{k}.trace.json.gz")) for k in (0, 1)]


def unranked(trace):
    """The trace as a script without torch.distributed's record or this capture's metadata writes it."""
    return {k: v for k, v in trace.items() if k not in ("distributedInfo", "autoresearch")}


def write_workers(folder, files):
    folder.mkdir()
    for name, trace in files.items():
        data = json.dumps(trace).encode()
        (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return str(folder)


def same_rows(got, want):  # an unranked trace has no metadata: no unprofiled step
    return [dict(r, rank=None, unprofiled_step_ms=None) for r in got] == \
        [dict(r, rank=None, unprofiled_step_ms=None) for r in want]


def test_worker_files_ranks_from_the_traces_latest_cycle(tmp_path, results, balanced_traces):
    r0, r1 = balanced_traces
    folder = write_workers(tmp_path / "log", {  # the name order is the opposite of the ranks'
        "host_200.1700000000000000002.pt.trace.json.gz": r0, "host_100.1700000000000000001.pt.trace.json.gz": r1,
        "host_100.1600000000000000000.pt.trace.json.gz": r0})  # an older cycle: read, it would be rank 0 twice
    r = summarize_folder(folder)
    assert r["world_size"] == 2 and r["ranks"] == results["balanced"]["ranks"]
    assert r["notes"] == ["1 older tensorboard_trace_handler file of the same worker left out: each worker's "
                          "latest is read"]


@pytest.mark.parametrize("files, note, order", [  # file name -> which trace; which trace is rank 0, rank 1
    ({"a_rank1.5.pt.trace.json": 1, "b_rank0.6.pt.trace.json.gz": 0}, "ranks read from the worker names", (0, 1)),
    ({"node_1200.1.pt.trace.json.gz": 0, "node_900.2.pt.trace.json.gz": 1}, "order of the numbers in the", (1, 0)),
    ({"beta.1.pt.trace.json.gz": 0, "alpha.2.pt.trace.json.gz": 1}, "ranks numbered in file-name order", (1, 0)),
])
def test_worker_files_ranks_from_the_names(tmp_path, results, balanced_traces, files, note, order):
    r = summarize_folder(write_workers(tmp_path / "log", {n: unranked(balanced_traces[k]) for n, k in files.items()}))
    assert [x["rank"] for x in r["ranks"]] == [0, 1] and any(note in n for n in r["notes"])
    want = results["balanced"]["ranks"]
    assert same_rows(r["ranks"], [want[k] for k in order])
    assert ("separate runs" in " ".join(r["notes"])) == ("worker names" not in note)


def test_one_worker_is_a_single_trace(tmp_path, balanced_traces):
    folder = write_workers(tmp_path / "log", {"rank0.1.pt.trace.json.gz": balanced_traces[0]})
    r = summarize_folder(folder)
    assert "ranks" not in r and r["notes"] == ["the folder holds one worker's trace: rank 0 of 2"]
    assert dict(r, notes=[]) == summarize(balanced_traces[0])


def test_worker_files_errors_name_the_problem(tmp_path, balanced_traces):
    r0, r1 = balanced_traces
    with pytest.raises(UserError, match="several workers' traces record rank 0: files of different runs"):
        summarize_folder(write_workers(tmp_path / "twice", {"a_1.1.pt.trace.json.gz": r0,
                                                             "a_2.1.pt.trace.json.gz": r0}))
    r2 = dict(r1, distributedInfo=dict(r1["distributedInfo"], rank=2, world_size=3))
    with pytest.raises(UserError, match=r"no trace for rank 1 \(the traces record rank 0, 2\)"):
        summarize_folder(write_workers(tmp_path / "gap", {"a.1.pt.trace.json.gz": r0, "b.1.pt.trace.json.gz": r2}))
    r3 = dict(r1, distributedInfo=dict(r1["distributedInfo"], world_size=3))
    with pytest.raises(UserError, match="the run had 3 ranks .* holds 2 workers' traces"):
        summarize_folder(write_workers(tmp_path / "few", {"a.1.pt.trace.json.gz": r0, "b.1.pt.trace.json.gz": r3}))


def test_cli_reads_a_worker_folder(tmp_path, capsys, balanced_traces):
    folder = write_workers(tmp_path / "log", {f"rank{k}.{k}.pt.trace.json.gz": unranked(t)
                                              for k, t in enumerate(balanced_traces)})
    assert main(["profile", folder]) == 0
    out = capsys.readouterr().out
    assert "## Ranks (2): the step on each rank" in out and "note: ranks read from the worker names" in out


# ---------------------------------------------------------------------------------------------------------
# Synthetic GPU traces (times in microseconds)

def gpu_trace(rank, kernels, world=2):
    """Two steps, CPU windows [0, 60000] and [60000, 90000]; kernels: [(name, launch, start, dur, stream)]."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": a,
               "dur": b - a} for i, (a, b) in enumerate([(0, 60000), (60000, 90000)])]
    for corr, (name, launch, start, dur, stream) in enumerate(kernels, 100):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch, "dur": 1.0, "args": {"correlation": corr}})
        args = {"correlation": corr, "stream": stream}
        if name.startswith("nccl"):
            args.update({"In msg nelems": 1048576, "dtype": "BFloat16"})
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start,
                       "dur": dur, "args": args})
    return {"traceEvents": events, "autoresearch": {"rank": rank, "world_size": world, "device": "NVIDIA H100"}}


# Each step: a GEMM on stream 7 and an all-reduce on stream 9 that outlasts it:
#   step 0: gemm [50000, 60000], nccl [56000, 64000] -> exposed 4000;  window 50000-100000 (50 ms)
#   step 1: gemm [100000, 120000], nccl [110000, 126000] -> exposed 6000;  window 100000-126000 (26 ms)
# Means: step 38, compute 15, communication 12, exposed 5, idle 18 (ms).
BASE = [("gemm_a", 10000, 50000, 10000, 7), (NCCL, 20000, 56000, 8000, 9),
        ("gemm_a", 65000, 100000, 20000, 7), (NCCL, 70000, 110000, 16000, 9)]


def write_ranks(folder, traces):
    for k, trace in enumerate(traces):
        (folder / f"rank-{k}.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    return str(folder)


def test_gpu_exposed_communication_hand_computed(tmp_path):
    r = summarize_folder(write_ranks(tmp_path, [gpu_trace(0, BASE), gpu_trace(1, BASE)]))
    row = r["ranks"][0]
    assert (row["step_ms"], row["compute_ms"], row["comm_ms"], row["exposed_comm_ms"], row["idle_ms"]) == \
        (38.0, 15.0, 12.0, 5.0, 18.0)
    assert r["categories"]["communication"] == 12.0 and r["categories"]["overlap"] == -7.0
    assert row["collectives"] == [{"name": NCCL.split("(")[0], "bytes": 2097152, "calls_per_step": 1.0,
                                   "ms_per_step": 12.0}]
    f = finding(r, "exposed_communication")
    assert f["ms_per_step"] == 5.0 and "2.10 MB" in f["evidence"]
    assert finding(r, "straggler") is None
    assert "communication" in [x["region"] for x in r["regions"]["rows"]]
    assert all(c["ok"] for c in r["checks"] if c["name"] == "categories cover device time")


def test_gpu_straggler_hand_computed(tmp_path):
    # rank 1's GEMMs take 4 ms longer: its all-reduces start 4 ms later, hidden but for 2 ms in step 1:
    # compute 19, exposed 1, work 37 ms/step against rank 0's 33
    slow = [("gemm_a", 10000, 50000, 14000, 7), (NCCL, 20000, 60000, 4000, 9),
            ("gemm_a", 65000, 100000, 24000, 7), (NCCL, 70000, 114000, 12000, 9)]
    r = summarize_folder(write_ranks(tmp_path, [gpu_trace(0, BASE), gpu_trace(1, slow)]))
    fast_row, slow_row = r["ranks"]
    assert slow_row["compute_ms"] == 19.0 and slow_row["exposed_comm_ms"] == 1.0 and slow_row["work_ms"] == 37.0
    assert fast_row["work_ms"] == 33.0
    assert r["skew"]["straggler"] == 1 and r["skew"]["work_spread_ms"] == 4.0
    f = finding(r, "straggler")
    assert f["ms_per_step"] == 4.0 and "GEMM +4.00" in f["evidence"]
    assert finding(r, "exposed_communication")["ms_per_step"] == 1.0  # what the last to join still pays
