"""results.tsv import and export. Pure: text in, rows or text out.

Import reads what autoresearch users' agents write (docs/memory.md, "Importing a results.tsv"):
- A header names the columns, in any order, case and surrounding spaces ignored, under the names in ALIASES.
  val_bpb and status are required, the rest optional; a column with no record field (the row's own id or
  iteration, anything unknown, a timestamp it cannot read) goes to the record's `extra`. The first line is
  a header when it holds no number (a data row always has its val_bpb).
- No header: upstream's 5 columns (commit, val_bpb, memory_gb, status, description), or the 8-column variant
  (iter, commit, val_bpb, best_val_bpb, memory_gb, status, description, timestamp) when a row starts with a
  number and has 8 fields.
Fields are split by the csv module (a quoted field may hold tabs); a line it cannot read as CSV (an odd
quote) is split on tabs as written. CRLF, a UTF-8 BOM, blank lines and `#` comment lines are fine. Surplus
fields of a row go to its description (a tab typed in it). Every bad row is reported, none hides another.

The dimension comes from a `[dimension]` prefix of the description, else `unlabeled`. Upstream writes a
crash as val_bpb 0.000000 and memory 0.0; here that is null. A row is identified by what every layout can
hold (commit, val_bpb to 6 places, memory_gb to 1 place, status, dimension, change; a row without a commit
by the rest), counted with multiplicity, so importing a file twice, or a file exported from the same
memory, adds nothing. Export writes upstream's layout.
"""
import csv
import math
import re
from collections import Counter
from datetime import datetime, timezone

from profiling.errors import UserError
from profiling.research.experiments import RECORD_KEYS, STATUSES, UNLABELED_DIMENSION

COLUMNS5 = ("commit", "val_bpb", "memory_gb", "status", "description")
COLUMNS8 = ("iter", "commit", "val_bpb", "best_val_bpb", "memory_gb", "status", "description", "timestamp")
# Header names as agents write them (compared lowercased and stripped). An `experiment`/`exp`/`id` column is
# kept in `extra` as `id`; it gives the record its commit only when it holds one (7-40 hex digits, a letter
# among them), never a made-up one from `exp12`.
_SHA = re.compile(r"^(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}$")
ALIASES = {
    "commit": ("commit",),
    "id": ("experiment", "exp", "id"),
    "iter": ("iter", "iteration", "#"),
    "val_bpb": ("val_bpb", "bpb"),
    "best_val_bpb": ("best_val_bpb",),  # not kept: records get baseline_bpb, export recomputes it
    "memory_gb": ("memory_gb", "mem_gb", "memory"),
    "status": ("status",),
    "description": ("description", "desc", "change"),
    "timestamp": ("timestamp", "time"),
}
REQUIRED = ("val_bpb", "status")
STATUS_ALIASES = {"keep": "keep", "kept": "keep", "discard": "discard", "discarded": "discard",
                  "crash": "crash", "crashed": "crash", "fail": "crash", "early_abort": "early_abort"}
_NAME = {alias: name for name, aliases in ALIASES.items() for alias in aliases}
_PREFIX = re.compile(r"^\s*\[([^\]]+)\]\s*(.*)$", re.DOTALL)
_EMPTY = ("", "-")  # an empty number cell (allowed for memory_gb, and for val_bpb of a crash or abort)


class _Bad(Exception):
    """One bad row: (column, value, why); column and value are None for a wrong number of fields."""


def split_description(description):
    """(dimension, change): `[optimizer] lr 0.04 -> 0.05` -> ("optimizer", "lr 0.04 -> 0.05")."""
    m = _PREFIX.match(description)
    if m:
        return m.group(1).strip().lower(), m.group(2).strip()
    return UNLABELED_DIMENSION, description.strip()


def join_description(dimension, change):
    text = change if dimension == UNLABELED_DIMENSION else f"[{dimension}] {change}"
    return " ".join((text or "").split())  # no tabs or newlines inside a TSV field


# ----------------------------------------------------------------------------
# Lines, fields and the layout

def _lines(text):
    """(line number, line) of the non-blank lines: CRLF or LF, a leading BOM dropped."""
    for number, line in enumerate(text.removeprefix("\ufeff").split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line


def _fields(line):
    """The stripped fields of one line: CSV quoting honoured, else the line split on tabs as written."""
    try:
        fields = next(csv.reader([line], delimiter="\t", strict=True))
    except csv.Error:
        fields = line.split("\t")
    return [f.strip() for f in fields]


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _header(fields, where):
    """The layout a header line names: one (name or None, label) per column. UserError if it lacks a
    required column or names one twice."""
    layout, seen = [], {}
    for i, label in enumerate(fields, 1):
        name = _NAME.get(label.lower())
        if name in seen:
            raise UserError(f"{where}: columns {seen[name]} and {i} ({layout[seen[name] - 1][1]!r} and "
                            f"{label!r}) are both {name}; rename or remove one")
        if name:
            seen[name] = i
        elif not label or any(label == lab for _, lab in layout):
            label = f"column {i}"
        layout.append((name, label))
    missing = [n for n in REQUIRED if n not in seen]
    if missing:
        accepted = "; ".join(f"{n}: {' or '.join(ALIASES[n])}" for n in missing)
        raise UserError(f"{where}: read as a header (it holds no number), but it names no "
                        f"{' and no '.join(missing)} column (it names {', '.join(map(repr, fields))}); "
                        f"accepted names: {accepted}")
    return layout


def _headerless(fields):
    columns = COLUMNS8 if len(fields) >= 8 and fields[0].isdigit() else COLUMNS5
    return [(name, name) for name in columns]


def _fit(fields, layout):
    """The fields, one per column: trailing empty ones dropped, surplus ones joined into the description."""
    while len(fields) > len(layout) and not fields[-1]:
        fields = fields[:-1]
    names = [name for name, _ in layout]
    surplus = len(fields) - len(layout)
    if surplus > 0 and "description" in names:
        d = names.index("description")
        fields = [*fields[:d], " ".join(fields[d:d + surplus + 1]), *fields[d + surplus + 1:]]
    if len(fields) != len(layout):
        raise _Bad(None, None, f"{len(fields)} columns, expected {len(layout)} "
                               f"({', '.join(label for _, label in layout)})")
    return fields


# ----------------------------------------------------------------------------
# One row

def _status(label, text):
    status = STATUS_ALIASES.get(text.lower())
    if status is None:
        also = [alias for alias in STATUS_ALIASES if alias not in STATUSES]
        raise _Bad(label, text, f"not one of {', '.join(STATUSES)} (or {', '.join(also)})")
    return status


def _number(label, text, status=None):
    """A number >= 0, None for 0 (how upstream writes a crash) or an allowed empty cell."""
    measured = status in ("keep", "discard")  # a val_bpb these rows must have
    if text in _EMPTY and not measured:
        return None
    try:
        value = float(text)
    except ValueError:
        raise _Bad(label, text, "missing" if text in _EMPTY else "not a number") from None
    if not math.isfinite(value) and status in ("crash", "early_abort"):
        return None  # a NaN loss
    if not math.isfinite(value) or value < 0:
        raise _Bad(label, text, "not a finite number >= 0")
    if value == 0 and measured:
        raise _Bad(label, text, f"0 for a {status} row")
    return value or None


def _time(text):
    """ISO 8601 (no zone: UTC, as the report reads it) or Unix seconds, as the memory's UTC time stamp."""
    try:
        if _is_number(text):
            seconds = float(text)
            t = datetime.fromtimestamp(seconds, timezone.utc) if 1e9 <= seconds < 1e10 else None
        else:
            t = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text))
    except ValueError:
        return None
    if t is None:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def _row(fields, layout):
    """The row as a dict; _Bad for the first problem."""
    fields = _fit(fields, layout)
    cells = {name: (label, text) for (name, label), text in zip(layout, fields) if name}
    text = {name: value for name, (_, value) in cells.items()}
    status = _status(*cells["status"])
    val = _number(*cells["val_bpb"], status)
    gb = _number(*cells["memory_gb"]) if "memory_gb" in cells else None
    dimension, change = split_description(" ".join(text.get("description", "").split()))
    extra = {name or label: value for (name, label), value in zip(layout, fields)
             if value and (name is None or name in ("id", "iter"))}
    stamp = text.get("timestamp")
    time = _time(stamp) if stamp else None
    if stamp and time is None:
        extra["timestamp"] = stamp  # not a time this reads: kept as written
    commit = text.get("commit") or (text["id"] if _SHA.match(text.get("id", "")) else None)
    return {"commit": commit, "val_bpb": val, "memory_gb": gb, "status": status,
            "dimension": dimension, "change": change, "timestamp": time, "extra": extra or None}


def read(text):
    """(rows, bad) of a results.tsv: the good rows in file order, and (line, column, value, why) for each
    bad one. UserError for what makes the whole file unreadable (a header without val_bpb or status)."""
    rows, bad, layout = [], [], None
    for number, line in _lines(text):
        fields = _fields(line)
        if fields[0].startswith("#") and fields[0] != "#":
            continue  # a comment
        if layout is None:
            if not any(_is_number(f) for f in fields):
                layout = _header(fields, f"line {number}")
                continue
            layout = _headerless(fields)
        try:
            rows.append(_row(fields, layout))
        except _Bad as e:
            bad.append((number, *e.args))
    return rows, bad


def bad_rows_text(bad):
    """One line per bad row: `line 7, val_bpb 'abc': not a number`."""
    return [f"line {n}: {why}" if column is None else f"line {n}, {column} {value!r}: {why}"
            for n, column, value, why in bad]


def parse(text, name="results.tsv"):
    """The rows of a results.tsv, in order; UserError listing every bad row."""
    rows, bad = read(text)
    if bad:
        raise UserError("\n".join([f"{name}: {len(bad)} bad rows", *bad_rows_text(bad)]))
    return rows


# ----------------------------------------------------------------------------
# Rows and records

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
        if row.get("extra"):
            record["extra"] = row["extra"]
        if row["status"] == "keep" and val is not None and (best_bpb is None or val < best_bpb):
            best_bpb = val
        out.append(record)
    return out


def _quoted(field):
    """A field as written, quoted only when it starts with a quote (which CSV would otherwise eat)."""
    return '"' + field.replace('"', '""') + '"' if field.startswith('"') else field


def export(records, columns=5):
    """The records as a results.tsv text (header included)."""
    lines, best = ["\t".join(COLUMNS8 if columns == 8 else COLUMNS5)], None
    for r in records:
        val, mb = r.get("val_bpb"), r.get("peak_vram_mb")
        if r["status"] == "keep" and val is not None and (best is None or val < best):
            best = val
        fields = [_quoted(r.get("commit") or ""), f"{val or 0:.6f}", f"{(mb or 0) / 1024:.1f}", r["status"],
                  _quoted(join_description(r["dimension"], r.get("change") or ""))]
        if columns == 8:
            fields = [str(r["id"]), *fields[:2], f"{best or 0:.6f}", *fields[2:], r.get("time") or ""]
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"
