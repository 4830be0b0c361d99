"""progress.png: val_bpb per experiment, drawn with matplotlib's Agg canvas (headless: no display, no pyplot
state). Imported only by `research report`, so the other commands never pay for matplotlib.

    png_bytes(series, title, labels) -> the PNG's bytes (profiling.research.report gives all three)

What it shows: kept runs as green dots joined by the running best (a green step line), discarded runs as
grey dots (those far above the kept ones as grey triangles on the top edge, so they do not squash the
interesting range), and, in a strip above the plot, runs without a val_bpb: crashes (red x) and early
aborts (orange triangles). Stagnation periods are shaded; the largest improvements are labelled.
"""
import io

# A bare Figure, no pyplot: nothing global changes, no GUI backend is looked for; savefig renders with Agg.
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from profiling.research.history import STAGNANT_NOT_KEPT

WIDTH_IN, HEIGHT_IN, DPI = 12, 6, 100  # 1200 x 600 px
KEEP, DISCARD, CRASH, ABORT, STAGNANT = "#2ca02c", "#9a9a9a", "#d62728", "#ff7f0e", "#fff3c4"
# The plot area's width and height, an 8-point character's width and a line's height, roughly, in points
# (1/72 in; 1.39 px at 100 dpi): enough to keep labels inside the plot and apart
AXES_PT, AXES_H_PT, CHAR_PT, LINE_PT = 750, 300, 4.2, 10
OUTLIER_SPAN = 1.0  # discards more than this many kept-range spans above the worst kept run go to the edge


def _limits(series):
    """(low, high) of the val_bpb axis: the kept runs' range plus room above for the near misses, and below
    for the labels of the lowest points."""
    kept = [v for _, v in series["keep"]]
    values = kept + [v for _, v in series["discard"]]
    if not values:
        return 0.9, 1.1
    lo, hi = min(values), max(kept or values)
    span = (hi - lo) or abs(hi) * 0.01 or 0.01
    top = min(max(values), hi + OUTLIER_SPAN * span)
    pad = (top - lo) or span
    return lo - 0.12 * pad, top + 0.06 * pad


def _marker_scale(series):
    """1 up to 200 experiments, smaller beyond (a month of eight agents is ~10,000), so points stay apart."""
    n = sum(len(series[k]) for k in ("keep", "discard", "crash", "early_abort"))
    return max(0.1, min(1.0, (200 / max(n, 1)) ** 0.5))


def _draw_points(ax, series, high):
    k = _marker_scale(series)
    shown = [(x, v) for x, v in series["discard"] if v <= high]
    above = [x for x, v in series["discard"] if v > high]
    handles = []
    if shown:
        ax.scatter(*zip(*shown), s=22 * k, color=DISCARD, alpha=0.8, zorder=2, linewidths=0)
        handles.append(Line2D([], [], marker="o", ls="", color=DISCARD, label="discarded"))
    if above:
        ax.scatter(above, [high] * len(above), marker="^", s=40 * k, color=DISCARD, zorder=2, clip_on=False)
        handles.append(Line2D([], [], marker="^", ls="", color=DISCARD, label="discarded, above the axis"))
    if series["best"]:
        ax.step(*zip(*series["best"]), where="post", color=KEEP, lw=2, alpha=0.7, zorder=3)
        handles.append(Line2D([], [], color=KEEP, lw=2, label="running best"))
    if series["keep"]:
        ax.scatter(*zip(*series["keep"]), s=46 * k, color=KEEP, edgecolors="black", linewidths=0.6 * k,
                   zorder=4)
        handles.append(Line2D([], [], marker="o", ls="", color=KEEP, markeredgecolor="black", label="kept"))
    return handles


def _draw_strip(strip, series):
    """Runs without a val_bpb, one row each for crashes and early aborts."""
    k = _marker_scale(series)
    strip.scatter(series["crash"], [1] * len(series["crash"]), marker="x", s=50 * k, color=CRASH,
                  linewidths=2 * k)
    strip.scatter(series["early_abort"], [0] * len(series["early_abort"]), marker="v", s=50 * k, color=ABORT)
    strip.set_ylim(-0.7, 1.7)
    strip.set_yticks([0, 1], [f"early abort ({len(series['early_abort'])})",
                              f"crash ({len(series['crash'])})"])
    strip.tick_params(axis="x", labelbottom=False, length=0)
    strip.grid(axis="x", alpha=0.3)
    for side in ("top", "right"):
        strip.spines[side].set_visible(False)
    return [Line2D([], [], marker="x", ls="", color=CRASH, markeredgewidth=2, label="crash (no val_bpb)"),
            Line2D([], [], marker="v", ls="", color=ABORT, label="early abort (no val_bpb)")]


def _label_boxes(labels, x_range, y_range):
    """[(x, y, text, dx, dy, ha)]: where each label of [(id, val_bpb, text)] goes, in points from its point.
    Below and left of a kept point lies no data (earlier bests are higher, discards lie above the best), so
    the text goes there, right-aligned, where it fits, else below and right; a label that would overlap one
    already placed (estimated in points) moves down a line until it does not."""
    (left, right), (low, high) = x_range, y_range
    placed, out = [], []
    for x, y, text in sorted(labels):
        px, py = (x - left) / (right - left) * AXES_PT, (y - low) / (high - low) * AXES_H_PT
        width = CHAR_PT * len(text)
        fits = px > width + 12
        x0 = px - 10 - width if fits else px + 10
        dy = -10
        while any(x0 < bx + bw and bx < x0 + width and abs(py + dy - by) < LINE_PT
                  for bx, by, bw in placed):
            dy -= LINE_PT
        placed.append((x0, py + dy, width))
        out.append((x, y, text, -10 if fits else 10, dy, "right" if fits else "left"))
    return out


def _annotate(ax, labels, x_range, y_range):
    for x, y, text, dx, dy, ha in _label_boxes(labels, x_range, y_range):
        # above the lines (3), below the points (4): the text stays legible, no point is hidden
        ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va="top", fontsize=8,
                    color="#1b5e20", zorder=3.5,
                    arrowprops={"arrowstyle": "-", "color": "#1b5e20", "lw": 0.6},
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75})


def _x_range(series):
    xs = [x for x, _ in series["keep"] + series["discard"]] + series["crash"] + series["early_abort"]
    return (min(xs) - 1, max(xs) + 1) if xs else (0, 1)


def draw(series, title, labels=()):
    """The progress figure (a matplotlib Figure on no display)."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    strip, ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1, 7]})
    low, high = _limits(series)
    for first, last in series["stagnation"]:
        for a in (ax, strip):
            a.axvspan(first - 0.5, last + 0.5, color=STAGNANT, zorder=0)
    handles = _draw_points(ax, series, high) + _draw_strip(strip, series)
    if series["stagnation"]:
        handles.append(Patch(color=STAGNANT, label=f"stagnation ({STAGNANT_NOT_KEPT}+ attempts without a keep)"))
    ax.set_ylim(low, high + (high - low) * 0.02)
    ax.set_xlim(*_x_range(series))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    _annotate(ax, labels, ax.get_xlim(), ax.get_ylim())
    ax.set_xlabel("experiment (id in experiments.json)")
    ax.set_ylabel("val_bpb (lower is better)")
    ax.grid(alpha=0.3)
    strip.set_title(title, fontsize=12)
    if any(series[k] for k in ("keep", "discard", "crash", "early_abort")):
        ax.legend(handles=handles, loc="upper right", fontsize=9, framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no experiments yet", transform=ax.transAxes, ha="center", va="center",
                fontsize=20, color="#666666")
        ax.tick_params(labelleft=False, labelbottom=False)
    return fig


def png_bytes(series, title, labels=()):
    """progress.png's bytes (1200 x 600 px)."""
    buf = io.BytesIO()
    draw(series, title, labels).savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()
