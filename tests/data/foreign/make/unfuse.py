"""Splits a trace merged by TraceLens's TraceFuse back into one rank's trace (SOURCES.md, amdhpc): TraceFuse puts every
rank's events in one file, tags each with args.rank and shifts pids, correlations and flow ids, keeping the originals
as args.pid_raw, args.correlation_raw and args.id_raw. This keeps the events of one rank and puts those back; the
top-level keys TraceFuse dropped (deviceProperties, distributedInfo) and the python_function events it skipped stay
absent: nothing is made up.

    python unfuse.py MERGED.json.gz RANK OUT.json.gz   # then trim.py OUT as usual
"""
import gzip
import json
import sys

ADDED = ("rank", "pid_raw", "correlation_raw", "id_raw")  # the args keys TraceFuse adds


def one_rank(merged, rank):
    out = []
    for e in merged["traceEvents"]:
        args = e.get("args") if isinstance(e, dict) else None
        if not isinstance(args, dict) or args.get("rank") != rank:
            continue
        e = dict(e, args={k: v for k, v in args.items() if k not in ADDED})
        e["pid"] = args["pid_raw"]
        if "correlation_raw" in args:
            e["args"]["correlation"] = args["correlation_raw"]
        if "id_raw" in args:
            e["id"] = args["id_raw"]
        out.append(e)
    return {k: v for k, v in merged.items() if k != "traceEvents"} | {"traceEvents": out}


if __name__ == "__main__":
    src, rank, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with gzip.open(src) as f:
        t = one_rank(json.load(f), rank)
    with open(dst, "wb") as f:
        f.write(gzip.compress(json.dumps(t, separators=(",", ":")).encode(), 9))
    print(dst, len(t["traceEvents"]), "events of rank", rank)
