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


def bar_chart(path: Path, title: str, unit: str, rows, marks=()):
    """Writes `rows` ([(label, value)], drawn top to bottom) as bars to `path`.

    A label starting with "forte" is drawn in forte's colour. `marks` are vertical reference
    lines [(value, text)], e.g. a target.
    """
    top = max([v for _, v in rows] + [v for v, _ in marks]) * 1.1
    height = 46 + ROW * len(rows) + 10 + 14 * len(marks)
    width = LABEL + BARS + 90
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
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
    out.append("</svg>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
