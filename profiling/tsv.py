"""results.tsv import and export: upstream autoresearch's 5 columns and its 8-column variant. Pure.

    5 columns: commit, val_bpb, memory_gb, status, description
    8 columns: iter, commit, val_bpb, best_val_bpb, memory_gb, status, description, timestamp

The dimension comes from a `[dimension]` prefix of the description, else `unlabeled`. Upstream writes a
crash as val_bpb 0.000000 and memory 0.0; here that is null. A row is identified by what both formats hold
(commit, val_bpb to 6 places, memory_gb to 1 place, status, dimension, change), counted with multiplicity,
so importing a file twice, or a file exported from the same memory, adds nothing.
"""
import math
import re
from collections import Counter

from profiling.errors import UserError
from profiling.memory import RECORD_KEYS, STATUSES, UNLABELED_DIMENSION

COLUMNS5 = ("commit", "val_bpb", "memory_gb", "status", "description")
COLUMNS8 = ("iter", "commit", "val_bpb", "best_val_bpb", "memory_gb", "status", "description", "timestamp")
_PREFIX = re.compile(r"^\s*\[([^\]]+)\]\s*(.*)$", re.DOTALL)


def split_description(description):
    """(dimension, change): `[optimizer] lr 0.04 -> 0.05` -> ("optimizer", "lr 0.04 -> 0.05")."""
    m = _PREFIX.match(description)
    if m:
        return m.group(1).strip().lower(), m.group(2).strip()
    return UNLABELED_DIMENSION, description.strip()


def join_description(dimension, change):
    text = change if dimension == UNLABELED_DIMENSION else f"[{dimension}] {change}"
    return " ".join((text or "").split())  # no tabs or newlines inside a TSV field


def _columns(fields):
    """The layout of a file from its first line: (columns, has_header)."""
    first = fields[0].strip().lower()
    if first in ("commit", "iter"):
        return (COLUMNS8 if first == "iter" else COLUMNS5), True
    return (COLUMNS8 if len(fields) >= 8 and fields[0].strip().isdigit() else COLUMNS5), False


def _number(text, where, what):
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{where}: {what} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{where}: {what} {text!r} is not a finite number >= 0")
    return value


def _row(fields, columns, where):
    if len(fields) < len(columns):
        raise UserError(f"{where}: {len(fields)} columns, expected {len(columns)} ({', '.join(columns)})")
    if columns is COLUMNS8:
        values = dict(zip(COLUMNS8[:6], fields[:6]))
        values["description"], values["timestamp"] = " ".join(fields[6:-1]), fields[-1].strip() or None
    else:
        values = dict(zip(COLUMNS5[:4], fields[:4]))
        values["description"], values["timestamp"] = " ".join(fields[4:]), None
    status = values["status"].strip().lower()
    if status not in STATUSES:
        raise UserError(f"{where}: status {values['status']!r} is not one of {', '.join(STATUSES)}")
    val = _number(values["val_bpb"], where, "val_bpb")
    gb = _number(values["memory_gb"], where, "memory_gb")
    if val == 0 and status in ("keep", "discard"):
        raise UserError(f"{where}: val_bpb 0 for a {status} row")
    dimension, change = split_description(values["description"])
    return {"commit": values["commit"].strip() or None, "val_bpb": val or None, "memory_gb": gb or None,
            "status": status, "dimension": dimension, "change": change, "timestamp": values["timestamp"]}


def parse(text, name="results.tsv"):
    """The rows of a results.tsv, in order; UserError naming the line for a bad one."""
    rows, columns = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        if columns is None:
            columns, header = _columns(fields)
            if header:
                continue
        rows.append(_row(fields, columns, f"{name}:{number}"))
    return rows


def _key(commit, val, gb, status, dimension, change):
    return (commit or "", f"{val or 0:.6f}", f"{gb or 0:.1f}", status, dimension, " ".join(change.split()))


def row_key(row):
    return _key(row["commit"], row["val_bpb"], row["memory_gb"], row["status"], row["dimension"], row["change"])


def record_key(record):
    mb = record.get("peak_vram_mb")
    return _key(record.get("commit"), record.get("val_bpb"), mb / 1024 if mb else None, record["status"],
                record["dimension"], record.get("change") or "")


def new_rows(records, rows):
    """The rows not yet in `records`: the k-th copy of a row is new only if the memory holds fewer than k."""
    have, seen, out = Counter(record_key(r) for r in records), Counter(), []
    for row in rows:
        key = row_key(row)
        seen[key] += 1
        if seen[key] > have[key]:
            out.append(row)
    return out


def records_from_rows(rows, best_bpb=None):
    """Experiment records for imported rows (no settings or dataset: they are compared only with each
    other). `best_bpb` is the best kept val_bpb among earlier imported records, the first baseline."""
    out = []
    for row in rows:
        val = row["val_bpb"]
        improvement = None if val is None or best_bpb is None else round(best_bpb - val, 9)
        record = dict.fromkeys(RECORD_KEYS)
        record.update(time=row["timestamp"], commit=row["commit"], dimension=row["dimension"],
                      change=row["change"], status=row["status"], val_bpb=val, baseline_bpb=best_bpb,
                      improvement=improvement, source="import-tsv",
                      peak_vram_mb=row["memory_gb"] * 1024 if row["memory_gb"] else None)
        if row["status"] == "keep" and val is not None and (best_bpb is None or val < best_bpb):
            best_bpb = val
        out.append(record)
    return out


def export(records, columns=5):
    """The records as a results.tsv text (header included)."""
    lines, best = ["\t".join(COLUMNS8 if columns == 8 else COLUMNS5)], None
    for r in records:
        val, mb = r.get("val_bpb"), r.get("peak_vram_mb")
        if r["status"] == "keep" and val is not None and (best is None or val < best):
            best = val
        fields = [r.get("commit") or "", f"{val or 0:.6f}", f"{(mb or 0) / 1024:.1f}", r["status"],
                  join_description(r["dimension"], r.get("change") or "")]
        if columns == 8:
            fields = [str(r["id"]), *fields[:2], f"{best or 0:.6f}", *fields[2:], r.get("time") or ""]
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"
