"""The memory timeline as a picture: for each kind of step, the arena's buffers as boxes, step index across,
arena offset down, the largest tensors labelled. Plain SVG (or the same SVG in an HTML page), no dependencies.

Tensor names come from the model, which may be hostile: they are escaped, never interpreted.
"""
from __future__ import annotations

from html import escape

from .budget import format_bytes

WIDTH, PANEL_HEIGHT, MARGIN, LABELLED = 900, 260, 60, 6
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _panel(report, top: int) -> list[str]:
    """One kind of step: boxes from (start, offset) to (end, offset + bytes), in a WIDTH x PANEL_HEIGHT frame."""
    steps, arena = max(report.n_steps, 1), max(report.arena_bytes, 1)
    plot_w, plot_h = WIDTH - 2 * MARGIN, PANEL_HEIGHT - 2 * MARGIN

    def x(step: int) -> float:
        return MARGIN + plot_w * (min(max(step, -1), steps) + 1) / (steps + 1)

    def y(offset: int) -> float:
        return MARGIN + plot_h * offset / arena

    out = [f'<text x="{MARGIN}" y="{MARGIN - 24}" font-size="14" font-weight="bold">{escape(report.kind)} step '
           f'({escape(report.model)}): arena {format_bytes(report.arena_bytes)}, naive {format_bytes(report.naive_bytes)}, '
           f'{report.n_steps} steps</text>',
           f'<rect x="{MARGIN}" y="{MARGIN}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
           f'<text x="{MARGIN}" y="{PANEL_HEIGHT - MARGIN + 16}" font-size="11">step 0</text>',
           f'<text x="{WIDTH - MARGIN}" y="{PANEL_HEIGHT - MARGIN + 16}" font-size="11" text-anchor="end">'
           f'step {steps - 1}</text>',
           f'<text x="{MARGIN - 6}" y="{MARGIN + 4}" font-size="11" text-anchor="end">0</text>',
           f'<text x="{MARGIN - 6}" y="{MARGIN + plot_h}" font-size="11" text-anchor="end">{format_bytes(arena)}</text>']
    largest = sorted(report.buffers, key=lambda b: -b["bytes"])[:top]
    for k, b in enumerate(report.buffers):
        x0, x1 = x(b["start"]), x(b["end"] + 1)
        y0, y1 = y(b["offset"]), y(b["offset"] + b["bytes"])
        out.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0, 1):.1f}" height="{max(y1 - y0, 0.5):.1f}" '
                   f'fill="{COLORS[k % len(COLORS)]}" fill-opacity="0.75" stroke="white" stroke-width="0.3">'
                   f'<title>{escape(b["name"])}: {format_bytes(b["bytes"])}, steps {b["start"]}-{b["end"]}</title></rect>')
    for b in largest:     # labels near the right edge end at their box's end instead of running off the picture
        right = x(b["start"]) > MARGIN + 0.7 * plot_w
        at, anchor = (x(b["end"] + 1) - 2, "end") if right else (x(b["start"]) + 2, "start")
        out.append(f'<text x="{at:.1f}" y="{y(b["offset"] + b["bytes"] / 2) + 4:.1f}" font-size="10" '
                   f'text-anchor="{anchor}">{escape(b["name"][:40])} {format_bytes(b["bytes"])}</text>')
    return out


def svg(profile, top: int = LABELLED) -> str:
    """The timeline of every step kind of ``profile`` (an ``edgetrain.profiling.Profile``) as one SVG."""
    body = []
    for k, report in enumerate(profile.reports):
        body.append(f'<g transform="translate(0,{k * PANEL_HEIGHT})">')
        body += _panel(report, top)
        body.append("</g>")
    height = PANEL_HEIGHT * max(len(profile.reports), 1)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n")


def html(profile, top: int = LABELLED) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>edgetrain memory timeline: "
            f"{escape(str(profile.artifacts))}</title></head><body>\n{svg(profile, top)}</body></html>\n")
