"""A profile's folder: where profiles go, and a captured trace summarized, rendered and written into a new folder
with its report. The live capture (profiling/profile/capture/) hands its exported trace here; the report is made by
reading that trace (profiling.profile.report.summary), exactly as `research profile TRACE` does later on any machine.

Files, under ./profiles (git-ignored; AUTORESEARCH_PROFILE_DIR names another), one folder per profile:
    profiles/<time>-<commit>/report.md        the Markdown report printed to stdout
    profiles/<time>-<commit>/summary.json     the same numbers as JSON
    profiles/<time>-<commit>/trace.json.gz    the Chrome trace (open it in https://ui.perfetto.dev); under
                                              torchrun one per rank: rank-<k>.trace.json.gz
    profiles/latest                           a link to the newest folder (the next report diffs against it):
                                              `cat profiles/latest/report.md`
"""
import gzip
import hashlib
import json
import os
import re
import sys
import time

from profiling.errors import UserError
from profiling.files import atomic_write

# regression, render and summary are imported by save() only, when a report is made: a live Profiler imports
# this module when it is created, and render's tabulate, imported then, would change how a Ctrl-C'd run exits
# (CPython 3.11: a string exec'd at exit, as a namedtuple's class is made when tabulate is first imported
# there by torch._dynamo's exit hook, turns an uncaught KeyboardInterrupt's exit from 130 into 1; issue #49).


def profile_dir():
    """Where profiles go: $AUTORESEARCH_PROFILE_DIR, else ./profiles (git-ignored)."""
    return os.environ.get("AUTORESEARCH_PROFILE_DIR", "profiles")


def previous_summary(folder):
    """The newest earlier profile's summary under `folder`, or None."""
    try:
        with open(os.path.join(folder, "latest", "summary.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def new_folder(root, stem):
    """Create root/stem (root/stem-2, ... if taken: two profiles in one second); return its name."""
    os.makedirs(root, exist_ok=True)
    name, n = stem, 1
    while True:
        try:
            os.mkdir(os.path.join(root, name))
            return name
        except FileExistsError:
            n += 1
            name = f"{stem}-{n}"


def save_trace(trace, ranks=None, root=None):
    """Write the trace alone into a new profile folder (the way out of an exception or of interpreter exit:
    no summary, no collective call); return its path. Under torchrun each rank writes a folder of its own."""
    root = root or profile_dir()
    stem = time.strftime("%Y%m%d-%H%M%S") + "-" + (trace["autoresearch"].get("commit") or "nocommit")
    if ranks and ranks.world_size > 1:
        stem += f"-rank{ranks.rank}"
    path = os.path.join(root, new_folder(root, stem), "trace.json.gz")
    atomic_write(path, gzip.compress(json.dumps(trace).encode(), compresslevel=1, mtime=0))
    return path


def run_identity(meta):
    """What makes two profiles comparable: the script that ran (its path) and the model's kind (its
    parameters' names and dimensions, layer numbers and sizes aside: a deeper or wider model of the same code
    still compares)."""
    params = meta.get("parameters")
    model = None
    if isinstance(params, dict) and params:
        names = sorted({f"{re.sub(r'[0-9]+', 'N', name)}:{len(shape) if isinstance(shape, list) else '?'}"
                        for name, shape in params.items()})
        model = hashlib.sha1("\n".join(names).encode()).hexdigest()[:12]
    return {"script": meta.get("script"), "model": model}


def comparable(previous, result):
    """The previous profile, when it is of the same script and model as this one (else None: its diff would
    compare two different programs), and the note saying why not."""
    if previous is None:
        return None, None
    if previous.get("run") != result.get("run"):
        return None, ("the previous profile (profiles/latest) is of another script or model: no changes section; "
                      "compare two profiles of one script with `research profile`")
    return previous, None


def save(trace, ranks=None, reference=None, top=10, root=None):
    """Summarize, render and write one captured trace (the files of the module's docstring); return (the
    Markdown report, the folder, the summary), the report and summary None on ranks other than 0.
    reference: (summary.json path, label) of the profile to look for a regression against, or None. ranks:
    in a several-process run, every rank writes rank-<k>.trace.json.gz into one folder, and rank 0 makes the
    one report of all ranks (profiling.profile.report.ranks) once all are written. root: where the folder goes
    (default: profile_dir()). The previous profile (root/latest) is compared with only when it is of the same
    script and model (run_identity)."""
    from profiling.profile.report import regression, render, summary
    n = ranks.world_size if ranks else 1
    root = root or profile_dir()
    previous = previous_summary(root)
    stem = time.strftime("%Y%m%d-%H%M%S") + "-" + (trace["autoresearch"].get("commit") or "nocommit")
    name = new_folder(root, stem) if n == 1 or ranks.first else None
    folder = os.path.join(root, ranks.from_first(name) if n > 1 else name)
    trace_gz = gzip.compress(json.dumps(trace).encode(), compresslevel=1, mtime=0)
    atomic_write(os.path.join(folder, f"rank-{ranks.rank}.trace.json.gz" if n > 1 else "trace.json.gz"),
                 trace_gz)
    if n > 1:
        ranks.barrier()  # every rank's trace is written
        if not ranks.first:
            return None, folder, None
        from profiling.profile.report import ranks as multi_rank
        result = multi_rank.summarize_folder(folder)
    else:
        result = summary.summarize(trace)
    if reference:
        try:
            regression.add(result, summary.load_summary(reference[0]), reference[1])
        except UserError as e:  # an unreadable reference costs the finding, not the profile
            print(f"profile: no regression check against {reference[0]}: {e}", file=sys.stderr)
    result["run"] = run_identity(trace["autoresearch"])
    previous, note = comparable(previous, result)
    if note:
        result.setdefault("notes", []).append(note)
    report = render.to_markdown(result, previous=previous, top=top)
    atomic_write(os.path.join(folder, "summary.json"), render.to_json(result))
    atomic_write(os.path.join(folder, "report.md"), report + "\n")
    link = os.path.join(root, f".latest-{os.getpid()}")
    os.symlink(os.path.basename(folder), link)  # relative, so the folder can move
    os.replace(link, os.path.join(root, "latest"))
    return report, folder, result
