"""Rendering the sections as Markdown (``report.md``) and as one self-contained HTML page
(``report.html``: inline CSS, plots embedded as ``data:image/png;base64`` URIs)."""

from __future__ import annotations

import base64

from rlhf.report import wording
from rlhf.report.formatting import esc, esc_attr
from rlhf.report.sections import build_sections


def _flatten(blocks):
    for b in blocks:
        if b[0] == "group":
            yield from _flatten(b[1])
        else:
            yield b


def render_markdown(res: dict, quote=lambda s: s) -> str:
    out = [
        "# RLHF with PPO — lab report",
        "",
        f"Run folder: `{res['run_dir']}`. The {wording.SCORE_SHORT} is the {wording.SCORE_NAME}. Curves are "
        f"drawn in report.html; every number is in results.json.",
        "",
    ]
    for anchor, title, blocks in build_sections(res, quote):
        out += [f"## {title}", ""]
        for b in _flatten(blocks):
            if b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "note":
                out += [f"> **Note.** {b[1]}", ""]
            elif b[0] == "list":
                out += [f"- {x}" for x in b[1]] + [""]
            elif b[0] == "table":
                out += [b[1].md()]
            elif b[0] == "img":
                out += [f"*({b[2]}: see the figure in report.html)*", ""]
    return "\n".join(out).rstrip() + "\n"


CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1d2430;background:#f6f7f9;margin:0}
main{max-width:1220px;margin:0 auto;padding:20px 28px 60px;background:#fff}
h1{font-size:26px;margin:8px 0 4px}
h2{font-size:20px;margin:34px 0 10px;padding-bottom:4px;border-bottom:2px solid #dde2ea}
p{line-height:1.45;max-width:1100px}.sub{color:#555;margin-top:0}
nav{font-size:13px;margin:10px 0 4px}nav a{margin-right:12px;color:#2857a4;text-decoration:none}
table{border-collapse:collapse;margin:10px 0 18px;font-size:13px}
caption{text-align:left;font-weight:600;padding:4px 0;color:#333}
th,td{border:1px solid #cfd5de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f5}tr.group td{background:#e4ebf5;font-weight:600}
table.compare td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
table.tokens{font-size:11px}table.tokens td,table.tokens th{padding:2px 5px}
table.tokens td{text-align:right;font-variant-numeric:tabular-nums}
table.tokens td:nth-child(2){text-align:left}
table.hashes td{font-family:monospace;font-size:11px;word-break:break-all}
table.outputs td{max-width:330px}table.outputs td.text{overflow-wrap:anywhere}
table.outputs td:first-child{white-space:nowrap}
td.ok{background:#e3f4e6}td.bad{background:#fbe5e5}td.warn{background:#fff1cc}
.note{background:#fff7e0;border-left:4px solid #e0a800;padding:8px 12px;margin:10px 0}
.honesty li{margin:4px 0;line-height:1.4}
img{max-width:100%;border:1px solid #e1e5eb;margin:6px 0}
.flex{display:flex;flex-wrap:wrap;gap:8px 28px;align-items:flex-start}
figure{margin:8px 0}figcaption{font-size:13px;color:#555}
"""


def render_html(res: dict, images: dict[str, bytes], quote=lambda s: s) -> str:
    sections = build_sections(res, quote)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>RLHF with PPO — lab report</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<h1>RLHF with PPO — lab report</h1>",
        f'<p class="sub">Run folder <code>{esc(res["run_dir"])}</code>. The {esc(wording.SCORE_SHORT)} is the '
        f"{esc(wording.SCORE_NAME)}. Every number is also in results.json.</p>",
        "<nav>" + "".join(f'<a href="#{esc_attr(a)}">{esc(t)}</a>' for a, t, _ in sections) + "</nav>",
    ]
    for anchor, title, blocks in sections:
        out.append(f'<section id="{esc_attr(anchor)}"><h2>{esc(title)}</h2>')
        out.extend(_html_blocks(blocks, images))
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


def _html_blocks(blocks, images) -> list[str]:
    out = []
    for b in blocks:
        if b[0] == "group":
            out.append('<div class="flex">' + "\n".join(_html_blocks(b[1], images)) + "</div>")
        elif b[0] == "p":
            out.append(f"<p>{esc(b[1])}</p>")
        elif b[0] == "note":
            out.append(f'<div class="note">{esc(b[1])}</div>')
        elif b[0] == "list":
            out.append('<ul class="honesty">' + "".join(f"<li>{esc(x)}</li>" for x in b[1]) + "</ul>")
        elif b[0] == "table":
            out.append(b[1].html())
        elif b[0] == "img":
            data = images.get(b[1])
            if data:
                uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
                out.append(
                    f'<figure><img src="{uri}" alt="{esc_attr(b[2])}"><figcaption>{esc(b[2])}</figcaption></figure>'
                )
    return out


def page_html(title: str, sections: list[tuple[str, list[str]]], figures: dict[str, tuple[bytes | None, str]]) -> str:
    """A self-contained study page: the lab's CSS, one <section> per (name, HTML blocks). A block
    "@NAME" stands for figures[NAME] = (PNG bytes, alt text), inlined as a data URI (left out when
    the bytes are None, as in the wording check of the page's own text)."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        f"<h1>{esc(title)}</h1>",
    ]
    for name, blocks in sections:
        out.append(f'<section id="{esc_attr(name.lower().replace(" ", "-"))}"><h2>{esc(name)}</h2>')
        for b in blocks:
            if b.startswith("@"):
                png, alt = figures[b[1:]]
                if png:
                    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
                    out.append(f'<figure><img src="{uri}" alt="{esc_attr(alt)}"></figure>')
            else:
                out.append(b)
        out.append("</section>")
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"
