"""Figures drawn with matplotlib from the same records as the tables."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

from suite.config.files import write_atomic
from suite.core.rounds import RATES
from suite.measure.contention import contended
from suite.records.schema import metrics_of, status_of
from suite.report import tables


def pyplot():
    """matplotlib's pyplot on the headless Agg backend (a figure never opens a window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, results_dir, name: str, dpi: int = 120) -> Path:
    """Lay `fig` out, write it as results_dir/figures/<name>.png at `dpi` (trimmed to what is drawn, a legend
    outside the axes included) and close it; returns the path."""
    fig.tight_layout()
    out = Path(results_dir) / "figures" / f"{name}.png"
    png = io.BytesIO()
    # no "Software" stamp: the bytes a render writes do not name the matplotlib that drew them
    fig.savefig(png, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    write_atomic(out, png.getvalue())
    pyplot().close(fig)
    return out


def slug(title: str) -> str:
    """A section's title as part of a file name: lower case, every other run of characters one underscore."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def figure_of_sections(exp, results_dir, name: str, draw, dpi: int = 120, front: bool = False) -> list[Path]:
    """One figure of every profile/device section with records (tables.sections: (title, cells, records) each):
    draw(sections) makes it (None: nothing to draw) and it is saved as <name>; nothing without records. With
    `front`, the front page's too, of front_sections alone, as front_<name>."""
    sections = tables.sections(exp, Path(results_dir), variants=False)
    out = []
    for prefix, chosen in (("", sections), *((("front_", front_sections(sections)),) if front else ())):
        fig = draw(chosen) if chosen else None
        if fig is not None:
            out.append(save(fig, results_dir, f"{prefix}{name}", dpi))
    return out


def figure_per_section(exp, results_dir, name: str, draw, dpi: int = 120) -> list[Path]:
    """A figure per profile/device section with records: draw(title, cells, records) makes it (None: nothing to
    draw) and it is saved as <name>_<the title's slug>."""
    paths = []
    for title, cells, records in tables.sections(exp, Path(results_dir), variants=False):
        fig = draw(title, cells, records)
        if fig is not None:
            paths.append(save(fig, results_dir, f"{name}_{slug(title)}", dpi))
    return paths


def grid_and_legend(ax, fontsize: float) -> None:
    """A light grid, and a legend where the axes hold a line."""
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=fontsize)


README_WIDTH_IN = 7.5  # inches at DPI: about 800 pixels, what a README shows without scaling
DPI = 110
PARTIAL = {"hatch": "///", "alpha": 0.55}  # how a row measured in fewer rounds than planned is drawn


def short(title: str) -> str:
    """A section's title (tables.sections) as a legend label: `<machine> · <profile>`, `counted` where it is."""
    m = re.match(r"(\w+) profile on (\S+) \((\w+) device\)(.*)", title)
    if not m:
        return title
    profile, machine, _, rest = m.groups()
    return f"{machine} · {profile}" + (" · counted" if "counted" in rest else "")


HATCHED_RATE = "hatched: fewer timing rounds than planned, or a rate of fewer than 3 (provisional)"
HATCHED_PARTIAL = "hatched: partial (its call ended before every round was measured)"


def legend_below(
    ax,
    with_partial: bool | str = False,
    sections: dict[str, str] | None = None,
    notes: list[str] = (),
) -> None:
    """The legend under the axes, outside the data, one entry a label: each section's colour (`sections`: label
    to colour, solid whatever its bars), then what the axes label, the hatching's meaning where a hatched row is
    drawn (`with_partial`: True for a rate's, or the words that say what the hatching marks), then `notes` (what
    is not drawn, and why)."""
    from matplotlib.patches import Patch

    seen = {label: Patch(facecolor=colour, edgecolor=colour) for label, colour in (sections or {}).items()}
    handles, labels = ax.get_legend_handles_labels()
    seen.update(zip(labels, handles))
    if with_partial:
        hatched = Patch(facecolor="white", edgecolor="grey", hatch=PARTIAL["hatch"])
        seen[with_partial if isinstance(with_partial, str) else HATCHED_RATE] = hatched
    for note in notes:
        seen[note] = Patch(facecolor="none", edgecolor="none")
    if seen:
        ax.legend(
            list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(0, -0.1), fontsize=8, frameon=False
        )


def partial(rec) -> bool:
    return bool(rec) and status_of(rec).kind == "partial"


def thin(rec) -> bool:
    """A rate too thinly sampled for a verdict: a partial record, or one of fewer than MIN_ROUNDS timing rounds (a
    sweep run with --rounds 1): drawn hatched, as a claim reading it is provisional (suite/report/reading.py)."""
    return partial(rec) or tables.thin_rate(rec)


def section_colours(secs) -> dict[str, str]:
    """One colour per section (its legend label: machine, profile), the same in every figure of a table."""
    labels = dict.fromkeys(short(title) for title, _, _ in secs)
    return {label: f"C{i % 10}" for i, label in enumerate(labels)}


def contended_rec(rec) -> bool:
    return bool(rec) and contended(metrics_of(rec))


def ratio_figures(exp, results_dir: Path) -> list[Path]:
    """One figure per ratio the table takes (`<experiment>_<metric>.png`): each row's ratio to the baseline row, a
    bar per machine section that has such a ratio (partial rows hatched, contended ones hollow), the paper's ratio
    marked beside. And the front page's (`front_<experiment>_<metric>.png`, the README's): the same, of the sections a
    reader came for alone (front_sections)."""
    secs = tables.sections(exp, Path(results_dir), variants=False)
    colours = section_colours(secs)
    front = front_sections(secs)
    out = []
    for metric in [m for m in exp.metrics if m.ratio]:
        for prefix, chosen in (("", secs), ("front_", front)):
            fig = _ratio_figure(exp, chosen, metric, colours) if chosen else None
            if fig is not None:
                out.append(save(fig, results_dir, f"{prefix}{exp.name}_{metric.key}", DPI))
    return out


def front_sections(secs) -> list:
    """The sections the front page draws (issue 51; issue 62): the paper profile on a GPU alone, so that the committed
    front page is the same whichever machine renders it; every machine's runs, the reader's own included, are on the
    table pages. Rows no ratio may rest on (suspect, other sweeps) draw no bar there either (_ratio_figure)."""
    return [s for s in secs if s[0].startswith("paper profile on ") and "(cuda device)" in s[0]]


LOG_SPAN = 20.0  # ratios spanning more than this draw on a log axis, labelled so


def _ratio_figure(exp, secs, metric, colours: dict[str, str]):
    key = f"{metric.key} x{exp.baseline}"
    names: list[str] = []
    series, paper = [], {}
    busy_ref = set()  # sections whose reference was timed on a busy machine: every rate ratio there withheld
    for title, cells, records in secs:
        cols, rows = tables.table_rows(exp, cells, records)  # the ratios the table shows, no other
        ours = {r[0]: (r[cols.index(f"{key} ours")], rec) for r, rec in zip(rows, records)}
        ref = ours.get(exp.baseline, (None, None))[1]
        if metric.key in RATES and contended_rec(ref):
            busy_ref.add(short(title))
        for r in rows:
            if r[0] not in names:
                names.append(r[0])
            if r[cols.index(f"{key} paper")] is not None:
                paper.setdefault(r[0], r[cols.index(f"{key} paper")])
        withheld = any(
            v is None and rec and (contended_rec(rec) or short(title) in busy_ref)
            for n, (v, rec) in ours.items()
            if n != exp.baseline
        )
        if withheld or any(v is not None for n, (v, _) in ours.items() if n != exp.baseline):
            series.append((short(title), ours))
    if not series:
        return None
    if metric.key not in RATES:  # sizes: machines that counted or measured the same ratios draw one bar, named both
        series = _merge_same(series, colours)
    doubted = suspect_notes(secs)
    hatch = thin if metric.key in RATES else partial  # a rate needs its rounds; memory one
    plt = pyplot()
    height = 1.2 + 0.16 * len(names) * (len(series) + 1) + 0.22 * len(series)
    fig, ax = plt.subplots(figsize=(README_WIDTH_IN, height))
    width = 0.8 / len(series)
    values = [v for _, ours in series for v, _ in ours.values() if isinstance(v, (int, float)) and v > 0]
    logged = bool(values) and max(values) / min(values) > LOG_SPAN  # one linear axis would squash the small bars
    withheld = False
    for k, (label, ours) in enumerate(series):
        for i, name in enumerate(names):
            value, rec = ours.get(name, (None, None))
            y = i + k * width
            if value is None:
                if name != exp.baseline and rec and (contended_rec(rec) or label in busy_ref):  # withheld: marked
                    ax.text(1.0, y, "  withheld: contended", va="center", fontsize=6, color=colours[label])
                    withheld = True
                continue
            style = {**(PARTIAL if hatch(rec) else {})}
            style.setdefault("facecolor", colours[label])
            ax.barh(y, value, width, edgecolor=colours[label], **style)
            ax.text(value, y, f" {value:.3g}x", va="center", fontsize=6)
    ys = [i + 0.4 - width / 2 for i in range(len(names))]
    marked = [(v, y) for name, y in zip(names, ys) if (v := paper.get(name)) is not None]
    if marked:
        ax.plot([v for v, _ in marked], [y for _, y in marked], "kD", ms=5, label="the paper")
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(ys, names, fontsize=8)
    ax.invert_yaxis()
    if logged:
        ax.set_xscale("log")
    ax.set_xlabel(f"{metric.label} / {exp.baseline}" + (" (log scale)" if logged else ""), fontsize=9)
    ax.set_title(f"{exp.title.split(':')[0]}: {metric.label} against {exp.baseline}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    drawn = [rec for _, ours in series for value, rec in ours.values() if value is not None]
    shown = {label: colours[label] for label, _ in series}
    toy = sorted({p for label, _ in series for p in ("tiny", "small") if f" · {p}" in label})
    notes = [
        *doubted,
        *(
            ["withheld: contended (the row or its reference timed on a busy machine), as the table withholds it"]
            if withheld
            else []
        ),
        *(
            [
                textwrap.fill(
                    f"{' and '.join(toy)} profile: a toy shape, where fixed costs (the embeddings, the relay's "
                    "buffers) outweigh what the paper's ratio measures; it shows the code runs, not the paper's claim",
                    90,
                )
            ]
            if toy and metric.key not in RATES
            else []
        ),
    ]
    legend_below(
        ax, any(hatch(rec) for rec in drawn) and (HATCHED_RATE if hatch is thin else HATCHED_PARTIAL), shown, notes
    )
    return fig


def _merge_same(series, colours: dict[str, str]):
    """Series whose drawn ratios are the same (3 significant figures) as one, its label naming each (the colour the
    first one's); the others as they were."""
    out: list[tuple[str, dict]] = []
    for label, ours in series:
        same = tuple(sorted((n, f"{v:.3g}") for n, (v, _) in ours.items() if isinstance(v, (int, float))))
        for i, (other, theirs) in enumerate(out):
            if same and same == tuple(
                sorted((n, f"{v:.3g}") for n, (v, _) in theirs.items() if isinstance(v, (int, float)))
            ):
                merged = f"{other}, {label}"
                colours.setdefault(merged, colours[other])
                out[i] = (merged, theirs)
                break
        else:
            out.append((label, ours))
    return out


def suspect_notes(secs) -> list[str]:
    """A line for each suspect row of `secs` (suite/records/trust.py): not drawn, and why, with its section."""
    return [
        textwrap.fill(
            f"not drawn: {short(title)} {cell.row.name} is suspect, and every ratio to it: {rec['suspect']}", 90
        )
        for title, cells, records in secs
        for cell, rec in zip(cells, records)
        if rec and rec.get("suspect")
    ]
