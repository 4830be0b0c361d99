"""Pure: pair the kernels of two profiles so that a recompile's renumbering is no change (the kernel rows
of summary.diff: `research profile NEW --previous OLD`, section 4 of the report).

Inductor names its kernels `triton_{kind}_fused_{ops}_{N}` and numbers them in the order it generates
them: after an unrelated edit, the MLP's `triton_poi_fused__to_copy__unsafe_view_pow_relu_7` comes back
as `..._8`, and an op list can gain or lose a view or a cast (`_unsafe_view`, `_to_copy`, `t`,
`scalar_tensor`). Compared by raw name, such a kernel shows as one gone (-11.36 ms/step) and one new
(+11.35), and the pair crowds the real changes out of the top rows.

The rule:

1. Each kernel row gets a key: its category and its name modulo the compile.
   - An Inductor kernel: its kind (poi, per, red, tem, for) and the set of words of its op list, without
     the views and casts that readable names leave out (classify.py's _NOISE_OPS) and without N. So
     `triton_poi_fused__to_copy__unsafe_view_pow_relu_7` and `triton_poi_fused_relu_pow_4` share a key;
     `triton_per_fused_add_mul_3` and `triton_poi_fused_add_mul_3` do not.
   - Any other name that is one identifier (a user Triton kernel such as `_rotary_norm_fwd_0`, a cuDNN
     engine `..._kernel0_0`): the name without a trailing `_N`.
   - Anything else (C++ signatures, cuBLAS's `nvjet_...` whose name is its tile shape, `Memcpy HtoD
     (...)`, CPU operators): the raw name.
   An op list of nothing but views and casts (`triton_poi_fused__to_copy_t_2`) keeps them. A kernel whose op
   list gains or loses a real op (`threshold_backward` fused in) is another kernel, as is another cuBLAS tile.
2. The kernels of one key are a group on each side; a group's time is the sum of its kernels' times. A key
   on both sides is one row with the change of that sum; a key on one side only is a kernel that appeared
   (previous 0) or disappeared (current 0).
3. No guessing: the kernels of a group (a norm's copy per layer, the optimizer's `triton_poi_fused_add_mul_3`,
   `_5`, ...) are never paired one to one, since their numbers mean nothing across compiles; the group is
   compared as a whole, as one row named `<name>_*` with its kernel counts. Two rows never share a name.

A row: name, raw_name (the current side's biggest kernel, else the previous side's), category, previous and
current (ms/step, None where absent), match ("same": one kernel on each side, one raw name; "renamed": one
kernel on each side, another raw name; "group"; "new"; "gone"), previous_raw_names and current_raw_names
(each side's kernels, biggest first). summary.diff adds change_ms and change_pct.
"""
import re

from profiling.profile.trace.classify import inductor_kernel, short_name

_IDENTIFIER = re.compile(r"^([A-Za-z_]\w*?)_\d+$")
_CLASH = re.compile(r" #\d+'*")  # classify.unique_names's number for readable names that clash


def match_key(raw, category):
    """The key two kernels share when they are the same kernel under other compile numbers (rule 1)."""
    raw = raw.strip()
    parts = inductor_kernel(raw)
    if parts is not None:
        kind, ops, _ = parts
        words = frozenset(w for w in ops.split("_") if w and not w.isdigit())
        return category, "triton", kind, words
    m = _IDENTIFIER.match(raw)
    return category, "name", m[1] if m else raw


def _base(raw):
    """The name of a group: the readable name of one of its kernels without its number."""
    m = _IDENTIFIER.match(raw.strip())
    if inductor_kernel(raw) is None and m:
        raw = m[1]
    return re.sub(r"_\d+$", "", short_name(raw))


def _groups(rows):
    groups = {}
    for row in rows:
        raw = row.get("raw_name", row["name"])
        groups.setdefault(match_key(raw, row["category"]), []).append(row)
    for members in groups.values():
        members.sort(key=lambda r: -(r.get("ms_per_step") or 0.0))
    return groups


def _raws(members):
    return [r.get("raw_name", r["name"]) for r in members]


def _row(before, now):
    """One row for a key: `before` and `now` are its kernels on each side (one of them may be empty)."""
    rep = (now or before)[0]
    raws_before, raws_now = _raws(before), _raws(now)
    if not before or not now:
        kind = "new" if now else "gone"
    elif len(before) == len(now) == 1:
        kind = "same" if raws_before == raws_now else "renamed"
    else:
        kind = "group"
    name = rep["name"]
    if max(len(before), len(now)) > 1:
        counts = f"{len(before)} -> {len(now)}" if before and now and len(before) != len(now) \
            else str(max(len(before), len(now)))
        name = f"{_base(_raws([rep])[0])}_* ({counts} kernels)"

    def total(members):
        return sum(r.get("ms_per_step") or 0.0 for r in members) if members else None

    return {"name": name, "raw_name": _raws([rep])[0], "category": rep["category"],
            "previous": total(before), "current": total(now), "match": kind,
            "previous_raw_names": raws_before, "current_raw_names": raws_now}


def match(previous, current):
    """The kernel rows of two summaries (their "kernels" lists), one row per key (see the module docstring):
    keys of the current summary first, in its order, then those only the previous one has."""
    before, now = _groups(previous), _groups(current)
    rows = [_row(before.get(key, []), now.get(key, [])) for key in dict.fromkeys(list(now) + list(before))]
    return _unique(rows)


def _unique(rows):
    """Rows of one name (groups named alike, a kernel gone and another new under one readable name) get their
    category, or where that is shared, new numbers across all the rows of that name, so that each row of the
    changes table names one thing."""
    named = {}
    for row in rows:
        named.setdefault(row["name"], []).append(row)
    for same in (rows_ for rows_ in named.values() if len(rows_) > 1):
        if len({r["category"] for r in same}) == len(same):
            for r in same:
                r["name"] += f" ({r['category']})"
            continue
        base = _CLASH.sub("", same[0]["name"])
        for i, r in enumerate((r for r in rows if _CLASH.sub("", r["name"]) == base), 1):
            r["name"] = f"{base} #{i}"
    return rows
