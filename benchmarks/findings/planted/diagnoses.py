"""A benchmark of diagnoses: plant one slowdown at a time in a copy of train.py, profile it, and check that
the profile's findings name the planted cause. The cases are in
benchmarks/findings/planted/diagnoses_cases.py.

    python3 benchmarks/findings/planted/diagnoses.py check [--cases ...]        # anywhere: every plant
    applies and compiles python3 benchmarks/findings/planted/diagnoses.py capture OUT [--cases baseline,new1]
    [--skip-existing] [--budget S] [--archive F]  # GPU uv run python benchmarks/findings/planted/diagnoses.py
    report OUT [OUT2 ...] [--markdown FILE] [--json FILE]  # anywhere

`--cases` takes case names and group names: `new` (issue #33's plants, NEW_CASES), `new1` and `new2` (its
two halves: one device call each, with the baseline), `all` (the default).

`check` applies every case's edits to train.py and compiles the result without running it. It exits
non-zero, naming the case, when an edit's text is not in train.py exactly once, when the result does not
parse, uses a module it does not import or touches os.environ after torch is imported, or when the line
the case names is not in the planted file once. `capture` runs the same check before any GPU work.

`capture` writes, per case, `OUT/<case>.trace.json.gz` (the profile's trace, with what the live run
recorded in its metadata), `OUT/<case>.log` (train.py's output), `OUT/<case>.plant.json` (the planted
line's number, for the check), and `OUT/device-<first case>.json` (the GPU, one timed bf16 8192^3 matmul
before and after: a braked or shared GPU shows there). Each case runs `train.py --profile` (2 warm-up + 5
profiled steps, as an agent runs it) in its own copy under .bench/diagnoses/<case>/, the edits applied by
exact text replacement: an edit whose text is no longer in train.py stops the benchmark instead of
silently planting nothing. Each case compiles into its own Inductor cache (TORCHINDUCTOR_CACHE_DIR in its
folder; SHARED_INDUCTOR_CACHE lists cases that keep the default one), so the lines of its compiled graphs
name its own folder (Inductor's on-disk cache keeps the paths of the run that first compiled a graph); the
price is a fresh compile per case (~30-60 s on an H100). `--skip-existing` skips the cases whose trace is
already in OUT, so a second call on the same machine goes on where a first one stopped; `--budget S`
starts no case that would not end within S seconds of the call's start (the longest case so far, at
least `--case-estimate`, plus the closing matmul), so a call ends on its own inside a device limit.
`--archive F` also writes the files this call produced into the tar.gz F (the device returns files of at most
16 MiB: a call's seven traces fit, every trace of a folder may not).

`report` reads the traces as `research profile` does and writes one row per case (several OUT folders:
each against its own baseline, measured in the same device call): the unprofiled and profiled ms/step,
the slowdown (unprofiled ms/step minus the baseline's, or minus the case's `against`), the top finding,
and two verdicts:

- `result`, issue #16's rule, kept so that the earlier plants compare before and after: ok when the top
  finding is of one of the case's `kinds`, or a finding of those kinds claims at least half the slowdown;
  a case with no kinds (quiet): ok when no finding costs 5% of the step or more.
- `issue33`, the rule of issue #33's acceptance, on the evidence, not the kind: for a case with kinds,
  the top finding (findings[0]) must (a) hold one of the case's `words` in its evidence or fix (any case),
  (b) where the case names a `line` (a stack ties the cause to it), hold `train.py:<that line's number in
  the planted file>` in its evidence, and (c) claim a gain (ms_per_step) within 30% of the slowdown; a
  slowdown under 10 ms is "too small" to check. For a quiet case (the baseline, a setting expected to cost
  nothing): no finding of 1% of the step or more, a slowdown under 10 ms, and where the case names
  `listed` words, a row of the summary's `settings.differs` whose name=value holds one of them ("settings
  not recorded" for a trace without the record). The `listed` column shows that for every case with
  `listed` words. Failing rows stay in the results.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

# CASES and plant are also read from here (tests/profile/test_findings.py)
from benchmarks.findings.planted.diagnoses_cases import (  # noqa: E402, F401
    CASES,
    GROUPS,
    NEW_CASES,
    PlantError,
    apply_plant,
    check_source,
    expand,
    line_number,
    plant,
)

MIN_PLANT_MS = 10.0     # issue #33: a new plant costs at least this per step; below it no gain is checked
GAIN_TOLERANCE = 0.30   # issue #33 (and #26's within_30pct): the top finding's gain within 30% of the loss
QUIET_PERCENT = 1.0     # issue #33: a quiet case has no finding of 1% of the step or more (as render shows)
EARLIER_QUIET_PERCENT = 5.0   # issue #16's rule for the same, kept in the `result` column
SHARED_INDUCTOR_CACHE = ("cache_first", "cache_shifted")  # cases about the compile cache: they keep the machine's default Inductor cache
CLOSING_S = 20.0        # the matmul timed after the cases, kept inside --budget
CASE_FILES = (".trace.json.gz", ".log", ".plant.json")  # what capture writes per case


# ---------------------------------------------------------------------------------------------------------
# check (anywhere)
# ---------------------------------------------------------------------------------------------------------

def check(args):
    """Every case's edits applied to train.py and compiled (nothing runs); exit 1 naming the failing ones."""
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        source = f.read()
    failed = []
    for case in expand(args.cases):
        try:
            planted = apply_plant(case, source)
            check_source(case, planted)
            line_number(case, planted)
            if CASES[case].kinds and not CASES[case].words:
                raise PlantError(f"case {case}: it plants a slowdown but names no words for its finding")
        except PlantError as e:
            failed.append(case)
            print(f"FAIL {e}")
    n = len(expand(args.cases))
    print(f"diagnoses check: {n - len(failed)} of {n} cases plant and compile" +
          (f"; failing: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------
# capture (GPU)
# ---------------------------------------------------------------------------------------------------------

def matmul_tflops():
    """One bf16 8192^3 matmul, median of 10 after 3 warm-ups, in TFLOP/s (a healthy H100: ~780)."""
    import torch
    from common import cuda_median_ms
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = cuda_median_ms(lambda: a @ a)
    return round(2 * 8192**3 / (ms / 1e3) / 1e12, 1)


def run_case(case, out, timeout):
    """Plant, run `train.py --profile`, keep the trace: the seconds it took."""
    folder = os.path.join(ROOT, ".bench", "diagnoses", case)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        source = plant(case, f.read())
    with open(os.path.join(folder, "train.py"), "w", encoding="utf-8") as f:
        f.write(source)
    with open(os.path.join(out, f"{case}.plant.json"), "w") as f:
        json.dump({"case": case, "planted": CASES[case].planted, "line": line_number(case, source),
                   "line_text": CASES[case].line}, f, indent=2)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, AUTORESEARCH_PROFILE_DIR=os.path.join(folder, "profiles"))
    if case not in SHARED_INDUCTOR_CACHE:  # compiled graphs name this folder's train.py, not another case's
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor-cache")
    hog = CASES[case].load and subprocess.Popen([sys.executable, "-c", CASES[case].load])
    t0 = time.time()
    env["PYTHONFAULTHANDLER"] = "1"  # a case past its timeout leaves its threads' stacks in its log
    try:
        with open(os.path.join(out, f"{case}.log"), "w") as log:
            proc = subprocess.Popen([sys.executable, os.path.join(folder, "train.py"), "--profile"], cwd=ROOT,
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # faulthandler prints where every thread is
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                code = f"timeout after {timeout:.0f} s (stacks at the end of its log)"
    finally:
        if hog:
            hog.kill()
            hog.wait()
    # the capture writes the trace before it reads it: a run stopped while reading still leaves its trace
    traces = sorted(glob.glob(os.path.join(folder, "profiles", "*", "trace.json.gz")), key=os.path.getmtime)
    if traces:
        shutil.copy(traces[-1], os.path.join(out, f"{case}.trace.json.gz"))
    print(f"{case}: exit {code}, {time.time() - t0:.0f} s" + ("" if traces or code != 0 else ", no trace"), flush=True)
    return time.time() - t0


def capture(args):
    cases = expand(args.cases)
    if check(args):  # every plant applies and compiles before any GPU time is spent
        sys.exit("diagnoses: fix the plants above first")
    os.makedirs(args.out, exist_ok=True)
    done = [c for c in cases
            if args.skip_existing and os.path.exists(os.path.join(args.out, f"{c}.trace.json.gz"))]
    if done:
        print(f"skipped (trace already in {args.out}): {', '.join(done)}", flush=True)
    todo = [c for c in cases if c not in done]
    if not todo:
        return
    import torch
    t_start, longest, ran = time.time(), args.case_estimate, []
    device = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "matmul_tflops_before": matmul_tflops()}
    for case in todo:
        left = args.budget - (time.time() - t_start) if args.budget else None
        if left is not None and left < longest + CLOSING_S:
            print(f"stopped before {case}: {left:.0f} s of the budget left, a case takes up to {longest:.0f} "
                  f"s; not run: {', '.join(todo[len(ran):])} (--skip-existing goes on)", flush=True)
            break
        timeout = args.timeout if left is None else min(args.timeout, left - CLOSING_S)
        longest = max(longest, run_case(case, args.out, timeout))
        ran.append(case)
    device["matmul_tflops_after"] = matmul_tflops()
    device["cases"] = ran
    name = f"device-{ran[0] if ran else todo[0]}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump(device, f, indent=2)
    print(json.dumps(device))
    if args.archive:
        archive(args.archive, args.out, [name] + [f"{c}{ext}" for c in ran for ext in CASE_FILES])


def archive(path, out, names):
    """The files this call wrote, in one tar.gz (the device returns files up to a size: every trace so far
    would not fit): names under OUT's own name, so extracting beside OUT adds them to it."""
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            if os.path.exists(os.path.join(out, name)):
                tar.add(os.path.join(out, name), arcname=os.path.join(os.path.basename(os.path.normpath(out)), name))
    print(f"archive: {path}, {os.path.getsize(path) / 2**20:.1f} MiB", flush=True)


# ---------------------------------------------------------------------------------------------------------
# report (anywhere)
# ---------------------------------------------------------------------------------------------------------

def _slowdown(unprofiled, reference):
    return unprofiled - reference if unprofiled is not None and reference is not None else None


def listed(case, s):
    """Whether the summary's settings list names the case's setting: "yes", "no", "not recorded", ""."""
    words = [w.lower() for w in CASES[case].listed]
    if not words:
        return ""
    settings = s.get("settings") or {}
    if not settings.get("recorded"):
        return "not recorded"
    rows = [f"{r.get('name')}={r.get('value')}".lower() for r in settings.get("differs") or []]
    return "yes" if any(w in r for w in words for r in rows) else "no"


def strict(case, s, slowdown, line):
    """Issue #33's verdict on a case: "ok", "ok (quiet)", "too small: ..." or "FAIL: <what is missing>"."""
    spec, findings = CASES[case], s.get("findings", [])
    if not spec.kinds:  # quiet: nothing to find, the setting (if any) in the header
        big = [f"{f['kind']} {f['ms_per_step']:.1f} ms" for f in findings
               if f["ms_per_step"] >= QUIET_PERCENT / 100 * s["step_ms"]]
        if slowdown is not None and slowdown >= MIN_PLANT_MS:
            big.append(f"costs {slowdown:.1f} ms: not quiet (give it kinds)")
        shown = listed(case, s)
        if shown == "no":
            big.append("the setting is not in the settings list")
        elif shown == "not recorded":
            big.append("settings not recorded")
        return "FAIL: " + "; ".join(big) if big else "ok (quiet)"
    if slowdown is None:
        return "no slowdown (no reference run)"
    if slowdown < MIN_PLANT_MS:
        return f"too small: {slowdown:.1f} ms < {MIN_PLANT_MS:g}"
    if not findings:
        return "FAIL: no finding"
    top, problems = findings[0], []
    text = f"{top.get('evidence', '')} {top.get('fix', '')}".lower()
    text = re.sub(r"\.bench/diagnoses/[^/\s]+/", "", text)  # the case's folder is in every path: not a word
    if not any(w.lower() in text for w in spec.words):
        problems.append("names no " + " / ".join(spec.words))
    number = str(line or "").rstrip("?")
    if spec.line and not number:
        problems.append("the planted line's number unknown")
    elif spec.line and not re.search(rf"train\.py:{number}(?!\d)", top.get("evidence", "")):
        guessed = " (today's train.py: no plant record)" if str(line).endswith("?") else ""
        problems.append(f"no train.py:{number}{guessed}")
    gain = (top["ms_per_step"] - slowdown) / slowdown
    if abs(gain) > GAIN_TOLERANCE:
        problems.append(f"gain {top['ms_per_step']:.1f} ms ({gain:+.0%})")
    return "FAIL: " + "; ".join(problems) if problems else "ok"


def evaluate(case, s, reference_ms, line=None):
    """One result row from a case's summary: issue #16's columns and verdict, then issue #33's."""
    findings = s.get("findings", [])
    unprofiled = s.get("unprofiled_step_ms")
    slowdown = _slowdown(unprofiled, reference_ms)
    expected = CASES[case].kinds if case in CASES else ()
    top = findings[0] if findings else None
    naming = [f for f in findings if f["kind"] in expected]
    named = bool(naming) and (naming[0] is top
                              or slowdown is not None and naming[0]["ms_per_step"] >= slowdown / 2)
    close = [f for f in naming if slowdown and abs(f["ms_per_step"] - slowdown) <= GAIN_TOLERANCE * slowdown]
    big = [f for f in findings if f["ms_per_step"] >= EARLIER_QUIET_PERCENT / 100 * s["step_ms"]]
    return {
        "case": case, "planted": CASES[case].planted if case in CASES else "?",
        "unprofiled_ms": round(unprofiled, 2) if unprofiled is not None else None,
        "profiled_ms": round(s["step_ms"], 2),
        "slowdown_ms": round(slowdown, 2) if slowdown is not None else None,
        "top_finding": f"{top['kind']} ({top['ms_per_step']:.1f} ms)" if top else "none",
        "naming_finding": f"{naming[0]['kind']} ({naming[0]['ms_per_step']:.1f} ms)" if naming else "none",
        "within_30pct": (f"{close[0]['kind']} ({close[0]['ms_per_step']:.1f} ms)" if close else "no")
        if expected else "",
        "result": ("ok" if not big else "FAIL: " + ", ".join(f["kind"] for f in big)) if not expected
        else ("ok" if named else "FAIL"),
        "listed": listed(case, s) if case in CASES else "",
        "issue33": strict(case, s, slowdown, line) if case in CASES else "",
    }


def planted_line(out, case):
    """The number of the case's planted line as capture recorded it, else ("N?") as in today's train.py (a
    capture older than the record: its train.py may have had other line numbers)."""
    path = os.path.join(out, f"{case}.plant.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f).get("line")
    if not CASES[case].line:
        return None
    with open(os.path.join(ROOT, "train.py"), encoding="utf-8") as f:
        return f"{line_number(case, apply_plant(case, f.read()))}?"


def report_folder(out, against_baseline):
    """Rows and summaries of one capture folder (one device call: its own baseline)."""
    from profiling.profile.report import regression, summary
    cases = [c for c in CASES if os.path.exists(os.path.join(out, f"{c}.trace.json.gz"))]
    summaries = {c: summary.summarize(summary.load_trace(os.path.join(out, f"{c}.trace.json.gz")))
                 for c in cases}
    if against_baseline and "baseline" in summaries:  # as a live run does with a kept run in the memory
        for c in cases:
            if c != "baseline":
                regression.add(summaries[c], summaries["baseline"], "the baseline")
    rows, call = [], os.path.basename(os.path.normpath(out))
    for c in cases:
        ref = CASES[c].against or "baseline"
        row = evaluate(c, summaries[c], summaries.get(ref, {}).get("unprofiled_step_ms"),
                       planted_line(out, c))
        rows.append(dict(row, reference=ref, call=call))
    rows += [{"case": c, "planted": CASES[c].planted, "result": "FAIL: no trace (see its log)",
              "issue33": "FAIL: no trace", "call": call}
             for c in CASES if c not in cases and os.path.exists(os.path.join(out, f"{c}.log"))]
    return rows, summaries


def report(args):
    from tabulate import tabulate

    rows, found = [], {}
    for out in args.out:
        more, summaries = report_folder(out, args.against_baseline)
        rows += more
        found.update({(f"{out}/{c}" if len(args.out) > 1 else c): s.get("findings", [])
                      for c, s in summaries.items()})
    keys = (["call"] if len(args.out) > 1 else []) + [
        "case", "unprofiled_ms", "profiled_ms", "slowdown_ms", "top_finding", "naming_finding",
        "within_30pct", "result", "listed", "issue33"]

    def cell(r, k):
        if k == "case" and r.get("reference", "baseline") != "baseline":
            return f"{r['case']} (vs {r['reference']})"
        return r.get(k, "")
    table = tabulate([[cell(r, k) for k in keys] for r in rows], headers=keys, tablefmt="github")
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "findings": found}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n\n" + "\n".join(_described(r["case"]) for r in rows) + "\n")


def _described(case):
    """One line on a case for the Markdown: what is planted, what issue #33's check looks for."""
    spec = CASES[case]
    if not spec.kinds:
        must = f" Quiet; listed as {' / '.join(spec.listed)}." if spec.listed else ""
    else:
        must = f" The top finding names {' / '.join(f'`{w}`' for w in spec.words)}"
        must += f" and the line of `{spec.line}`." if spec.line else "."
    return f"- `{case}`: {spec.planted}.{must}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("check", help="every case's edits applied to train.py and compiled (nothing runs)")
    k.add_argument("--cases", help="comma-separated case or group names (default: all)")
    c = sub.add_parser("capture", help="on the GPU: plant each case, profile it, keep the traces")
    c.add_argument("out")
    c.add_argument("--cases", help=f"comma-separated case or group names ({', '.join(GROUPS)}; "
                                   "default: all)")
    c.add_argument("--timeout", type=int, default=240, help="seconds per case (default 240)")
    c.add_argument("--skip-existing", action="store_true",
                   help="skip the cases whose trace is already in OUT")
    c.add_argument("--budget", type=float,
                   help="seconds for the whole call: start no case that would not end within it (the "
                        "longest case so far, at least --case-estimate)")
    c.add_argument("--archive", metavar="TAR_GZ",
                   help="also write the files this call produced (not those --skip-existing kept) into this "
                        "tar.gz, to bring back from a device that returns files up to a size")
    c.add_argument("--case-estimate", type=float, default=90.0,
                   help="seconds a case is assumed to take before one has run (default 90)")
    r = sub.add_parser("report", help="findings per case from the kept traces")
    r.add_argument("out", nargs="+", help="capture folders, each with its own baseline")
    r.add_argument("--json")
    r.add_argument("--markdown")
    r.add_argument("--against-baseline", action="store_true",
                   help="profile each case against the baseline's, as a run whose memory holds the "
                        "baseline as its best kept run (adds the regression finding)")
    args = p.parse_args(argv)
    return {"check": check, "capture": capture, "report": report}[args.command](args) or 0


if __name__ == "__main__":
    sys.exit(main())

