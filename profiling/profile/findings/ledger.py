"""Pure: each millisecond of the step claimed once, whatever the rules. Stdlib only.

    found, notes = admit(found, ctx)   # after power.net_of_clock and settings.merge; costliest first

Every finding says what it prices (contract.run attaches it): `_kernels`, {device event id: us} of the
kernels whose time its gain comes from, and `_gaps`, {gap id: us} of the GPU idle its rule gave a cause
(Gap.cause: no two rules give one gap a cause, so idle is never priced twice). Two rules may still price the
same kernels: a GPU-wide cause (slow_device) and a cause in those kernels (misaligned_shapes), or a fallback
(over_bound) beside a narrower rule. The ledger admits the findings costliest first; each one's gain is cut
by the share of its own kernels' and gaps' time an admitted finding already prices (the gain taken as spread
over them by their time), and the kernels it keeps are its own from then on. A finding the cut leaves under
FLOOR of the step is left out; the running sum is never let past the step, the shorter of the profiled and the
unprofiled one where the live capture measured both (what the user's step takes is the most a fix can save; T5
on the H100: 62.8 ms of findings in a 60.2 ms unprofiled step, before), (a finding that prices no kernels
or gaps, from the regions table, is held to what the step has left). Each cut and each finding left out is
said in a note.
"""

FLOOR = 0.01   # of the step: the report shows no finding under it (render.SHOW_PERCENT)


def admit(found, ctx):
    """(the findings, costliest first, each pricing kernels and gaps no other one prices, their sum at most
    the step; the notes on what was cut or left out). The findings keep `_kernels` and `_gaps` (what each
    prices now); `public` drops them."""
    step, taken, total = _ceiling(ctx), {}, 0.0
    out, notes = [], []
    for f in sorted(found, key=lambda f: -f["ms_per_step"]):
        kernels, gaps = f.get("_kernels") or {}, f.get("_gaps") or {}
        shared = {i: us for i, us in kernels.items() if i in taken}
        ms = f["ms_per_step"]
        if shared:
            ms = _cut(f, shared, kernels, gaps, taken, ctx)
            if ms < FLOOR * step:
                notes.append(_left_out(f, shared, kernels, taken, ctx))
                continue
        if total + ms > step:
            notes.append(f"{f['kind']}: its gain cut from {ms:.1f} to {max(0.0, step - total):.1f} ms/step, "
                         f"the findings above it already claim {total:.1f} of the step's {step:.1f} ms")
            ms = max(0.0, step - total)
            if ms < FLOOR * step:
                continue
        for i in kernels:
            taken.setdefault(i, f["kind"])
        f = _priced(f, ms, ctx) if ms != f["ms_per_step"] else f
        f["_kernels"] = {i: us for i, us in kernels.items() if i not in shared}
        total += ms
        out.append(f)
    return out, notes


def _ceiling(ctx):
    """The most the findings may sum to: the profiled step, or the unprofiled one where it is shorter."""
    unprofiled = ctx.get("unprofiled")
    if isinstance(unprofiled, (int, float)) and 0 < unprofiled < ctx["step"]:
        return unprofiled
    return ctx["step"]


def public(f):
    """A finding without the ledger's private keys (what the summary keeps)."""
    return {k: v for k, v in f.items() if not k.startswith("_")}


def _cut(f, shared, kernels, gaps, taken, ctx):
    """The finding's gain less the share of its kernels' and gaps' time that earlier findings price."""
    own = sum(kernels.values()) + sum(gaps.values())
    share = sum(shared.values()) / own if own else 1.0
    ms = max(0.0, f["ms_per_step"] * (1 - share))
    f["evidence"] += (f"; {_ms(shared, ctx):.1f} of the {_ms(kernels, ctx):.1f} ms/step of kernels it prices "
                      f"are priced by {_by(shared, taken)} above: its gain cut by that share, from "
                      f"{f['ms_per_step']:.1f} to {ms:.1f} ms/step")
    return ms


def _left_out(f, shared, kernels, taken, ctx):
    return (f"{f['kind']} ({f['ms_per_step']:.1f} ms/step) left out: {_ms(shared, ctx):.1f} of the "
            f"{_ms(kernels, ctx):.1f} ms/step of kernels it prices are priced by {_by(shared, taken)}, and "
            f"what is left is under {100 * FLOOR:g}% of the step")


def _priced(f, ms, ctx):
    return dict(f, ms_per_step=round(ms, 2), pct_of_step=round(100 * ms / ctx["step"], 1))


def _by(shared, taken):
    return ", ".join(sorted({taken[i] for i in shared}))


def _ms(events, ctx):
    return sum(events.values()) / ctx["n"] / 1e3
