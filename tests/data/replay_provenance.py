"""Give a trace the source-line record (`autoresearch.provenance`) of its compile, from that compile's
structured trace: replays the TORCH_TRACE log's records through profiling/profile/capture/provenance.py's Collector, the same
records its in-process handler receives. How tests/data/h100-lines-gpt-2steps was made (a run with
INDUCTOR_PROVENANCE=1 TORCH_TRACE=DIR, then trim_trace.py):

    uv run python tests/data/replay_provenance.py DIR/dedicated_log_torch_trace_*.log IN.trace.json.gz \
        OUT.trace.json.gz ROOT      # ROOT: the folder train.py ran in (own files are named relative to it)
"""
import argparse
import gzip
import json
import re
import types

from profiling.profile.capture.provenance import Collector

HEAD = re.compile(r"^V\d{4} [\d:.]+ \d+ [^\]]*\] (\{.*\})$")


def records(path):
    """(metadata, payload or None) of each record of a structured-trace log, in order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = HEAD.match(line.rstrip("\n"))
            if m:
                out.append([json.loads(m.group(1)), []])
            elif line.startswith("\t") and out:
                out[-1][1].append(line[1:])
    return [(meta, "".join(payload) if payload else None) for meta, payload in out]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("trace_in")
    p.add_argument("trace_out")
    p.add_argument("root")
    args = p.parse_args()
    collector = Collector(args.root, running=False)  # the log's files are not this process's code
    for meta, payload in records(args.log):
        collector.emit(types.SimpleNamespace(metadata=meta, payload=payload))
    with gzip.open(args.trace_in, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    trace["autoresearch"]["provenance"] = record = collector.result()
    with gzip.open(args.trace_out, "wt", encoding="utf-8") as f:
        json.dump(trace, f)
    print(f"{len(record['graphs'])} graphs, {sum(len(g['kernels']) for g in record['graphs'])} calls")


if __name__ == "__main__":
    main()
