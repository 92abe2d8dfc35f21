"""A horizontal bar chart as SVG, for the benchmark scripts' results in docs/benchmarks.md.

Plain SVG text so the scripts need nothing beyond Python's standard library; GitHub and any
browser render it inline from the Markdown.
"""

from html import escape
from pathlib import Path

ROW = 26  # px per bar
LABEL = 330  # px for the contender names
BARS = 420  # px for the longest bar
FORTE = "#d95f02"
OTHER = "#7570b3"


def svg_start(width, height, title):
    """An SVG's opening lines: its size, a white ground and the title."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="DejaVu Sans, sans-serif" font-size="12">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']


def write_svg(path: Path, lines):
    """Closes the SVG of `lines` and writes it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines + ["</svg>\n"]))


def bar_chart(path: Path, title: str, unit: str, rows, marks=()):
    """Writes `rows` ([(label, value)], drawn top to bottom) as bars to `path`.

    A label starting with "forte" is drawn in forte's colour. `marks` are vertical reference
    lines [(value, text)], e.g. a target.
    """
    top = max([v for _, v in rows] + [v for v, _ in marks]) * 1.1
    height = 46 + ROW * len(rows) + 10 + 14 * len(marks)
    width = LABEL + BARS + 90
    out = svg_start(width, height, title)
    for i, (label, value) in enumerate(rows):
        y = 36 + i * ROW
        w = BARS * value / top
        colour = FORTE if label.startswith("forte") else OTHER
        out.append(f'<text x="{LABEL - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{LABEL}" y="{y + 2}" width="{w:.1f}" height="{ROW - 6}" fill="{colour}"/>')
        out.append(f'<text x="{LABEL + w + 5:.1f}" y="{y + 15}">{value:.1f} {escape(unit)}</text>')
    bottom = 36 + ROW * len(rows)
    # Each mark's label on a line of its own: two targets can sit a few pixels apart.
    for k, (value, text) in enumerate(marks):
        x = LABEL + BARS * value / top
        out.append(f'<line x1="{x:.1f}" y1="30" x2="{x:.1f}" y2="{bottom}" stroke="black" '
                   f'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 16 + 14 * k}" text-anchor="middle">{escape(text)}</text>')
    write_svg(path, out)


PALETTE = {"forte": FORTE, "rsync": "#7570b3", "rclone": "#1b9e77"}


def line_panels(path: Path, title: str, unit: str, xs, panels, x_label="round trip (ms)"):
    """Side-by-side line charts sharing one y axis: `panels` is [(panel title, {series label:
    [y per x in xs, or None]})]. `xs` are drawn evenly spaced (categories, e.g. round trips).
    A series is coloured by the first word of its label (forte, rsync, rclone)."""
    top = max(y for _, series in panels for ys in series.values() for y in ys if y is not None) * 1.1
    pw, ph, left, gap = 260, 220, 50, 30
    width = left + len(panels) * (pw + gap) + 10
    height = 60 + ph + 40 + 18 * max(len(series) for _, series in panels)
    out = svg_start(width, height, title)
    y0 = 50 + ph

    def y_of(v):
        return y0 - ph * v / top

    for tick in range(0, 5):
        v = top / 1.1 * tick / 4
        out.append(f'<text x="{left - 6}" y="{y_of(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    out.append(f'<text x="12" y="{50 + ph / 2}" transform="rotate(-90 12 {50 + ph / 2})" '
               f'text-anchor="middle">{escape(unit)}</text>')
    for k, (name, series) in enumerate(panels):
        x0 = left + k * (pw + gap)

        def x_of(i):
            return x0 + 20 + (pw - 40) * i / max(1, len(xs) - 1)

        out.append(f'<rect x="{x0}" y="50" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{x0 + pw / 2}" y="44" text-anchor="middle" font-weight="bold">{escape(name)}</text>')
        for i, x in enumerate(xs):
            out.append(f'<text x="{x_of(i):.1f}" y="{y0 + 16}" text-anchor="middle">{escape(str(x))}</text>')
        out.append(f'<text x="{x0 + pw / 2}" y="{y0 + 32}" text-anchor="middle">{escape(x_label)}</text>')
        for j, (label, ys) in enumerate(series.items()):
            colour = PALETTE.get(label.split()[0], "#666")
            dash = ' stroke-dasharray="5 3"' if j % 2 and label.split()[0] != "forte" else ""
            points = [(x_of(i), y_of(y)) for i, y in enumerate(ys) if y is not None]
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                       + " ".join(f"{a:.1f},{b:.1f}" for a, b in points) + '"/>')
            out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in points]
            if k == 0:
                ly = y0 + 52 + 18 * j
                out.append(f'<line x1="{left}" y1="{ly - 4}" x2="{left + 24}" y2="{ly - 4}" stroke="{colour}" '
                           f'stroke-width="2"{dash}/>')
                out.append(f'<text x="{left + 30}" y="{ly}">{escape(label)}</text>')
    write_svg(path, out)
