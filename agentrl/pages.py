"""What the two report writers share (`agentrl report`'s run report, the probe's horizon report): headless
plots rendered to PNG bytes, and self-contained HTML pages (inline CSS, every figure a data URI, nothing to
fetch), so that a report can be mailed or committed as one file.

>>> html = page("A title", "body{margin:0}", [table([("a", "<1>")]), figure("x.png", b"PNG")])
>>> html.startswith("<!DOCTYPE html>") and "<td>&lt;1&gt;</td>" in html and "base64,UE5H" in html
True
"""

from __future__ import annotations

import base64
import html as html_lib
import io
from collections.abc import Iterable, Sequence
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend: reports are made on servers and in CI, with no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (laid out tight, 100 dpi); the figure is closed."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def page(title: str, css: str, body: Iterable[str]) -> str:
    """A whole page: `body`'s parts (HTML, already escaped) under `title`, with `css` inline."""
    head = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html_lib.escape(title)}</title>'
            f"<style>{css}</style></head><body>"]
    return "\n".join([*head, *body, "</body></html>"])


def table(rows: Sequence[tuple[Any, ...]], header: Sequence[str] | None = None, th_first: bool = False,
          first_class: str | None = None) -> str:
    """An HTML table of `rows` (each cell escaped); `th_first`: the first cell of each row is its header;
    `first_class`: a CSS class for the first cell of each row."""
    e = html_lib.escape
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
    first = "th" if th_first else "td"
    attr = f" class='{e(first_class)}'" if first_class else ""
    for row in rows:
        cells = [f"<{first}{attr}>{e(str(c))}</{first}>" if i == 0 else f"<td>{e(str(c))}</td>"
                 for i, c in enumerate(row)]
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def figure(name: str, data: bytes, caption: str | None = None) -> str:
    """A PNG embedded as a data URI, with its caption."""
    e = html_lib.escape
    img = f'<img alt="{e(name)}" src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}">'
    return f"<figure>{img}<figcaption>{e(caption)}</figcaption></figure>" if caption else f"<figure>{img}</figure>"
