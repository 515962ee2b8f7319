"""Attention maps of one text: a PNG grid (layers by heads) and a self-contained interactive HTML page.

`render_attention` runs any saved model's encoder on one text with `output_attentions=True` (the explicit
softmax path of the encoder) and writes

- ``<name>.html``: the attention probabilities as inline JSON with a few lines of JavaScript; pick a layer
  and a head (or the mean over heads) and see the token-by-token heat map; hover a cell for its weight.
  No CDN, no network: the file works offline and can be attached to an issue.
- ``<name>.png``: every selected (layer, head) map in one grid, rows = layers, columns = heads, with a colour
  bar of the weights. Needs matplotlib (the `plot` extra); without it the PNG is skipped with a warning
  unless `png=True` demands it. Chinese text is drawn with a CJK font when the machine has one
  (`plots.cjk_font`); when it has none, a warning says so and points to the HTML page, which the browser
  draws with its own fonts.

Row i of a map is where token i attends (each row sums to 1); padding never appears, as one text is
encoded alone. The server's attention route runs the same code through its scheduler (`AttentionSteps`).
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.checkpoint_format import load_tokenizer
from bertforge.errors import ConfigError, InputError
from bertforge.families import registry
from bertforge.inference.plots import cjk_font, needs_cjk_font
from bertforge.model.bert import BertModel
from bertforge.storage import write_bytes
from bertforge.tokenization.normalizer import is_blank

log = logging.getLogger(__name__)

MAX_TOKENS = 128  # beyond this the maps are unreadable and the HTML grows past several MB
# The name the serving scheduler runs `AttentionSteps` under, beside the served pipelines' tasks.
ATTENTION_TASK = "attention"


def encoder_of(model: torch.nn.Module) -> BertModel:
    """The encoder of a loaded model: the model itself, or a task model's `.bert`."""
    return model if isinstance(model, BertModel) else model.bert


@dataclass
class AttentionWindow:
    """One text made ready for the encoder: its tokens and their ids (`input_ids`: what the scheduler's token
    budgets count, `family_pipelines.feature_tokens`)."""

    tokens: list[str]
    input_ids: list[int]
    type_ids: list[int]


def attention_window(encoder: BertModel, tokenizer, text: str) -> AttentionWindow:
    """`text` tokenized for `attention_run`; InputError for an empty text or one over `MAX_TOKENS` tokens (or
    the encoder's positions), before the model runs."""
    if not isinstance(text, str) or is_blank(text):
        raise InputError("text is empty; give a sentence to draw the attention of")
    encoding = tokenizer.encode(text)
    limit = min(MAX_TOKENS, encoder.config.max_position_embeddings)
    if len(encoding.ids) > limit:
        raise InputError(f"the text has {len(encoding.ids)} tokens; attention maps are drawn for at most "
                         f"{limit} (use a shorter text)")
    return AttentionWindow(list(encoding.tokens), list(encoding.ids), list(encoding.type_ids))


def attention_run(encoder: BertModel, window: AttentionWindow) -> torch.Tensor:
    """The attention probabilities [L, N, T, T] in fp32, on the CPU, of one window under a loaded encoder (on
    whatever device it sits)."""
    device = next(encoder.parameters()).device
    ids = torch.tensor([window.input_ids], device=device)
    with torch.inference_mode():
        out = encoder(ids, torch.tensor([window.type_ids], device=device), torch.ones_like(ids),
                      output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float().cpu()  # L x [1, N, T, T] -> [L, N, T, T]


def attention_of(encoder: BertModel, tokenizer, text: str) -> tuple[list[str], torch.Tensor]:
    """(tokens [T], attention probabilities [L, N, T, T] in fp32, on the CPU) of `text` under a loaded encoder
    (on whatever device it sits); InputError for an empty text or one over `MAX_TOKENS` tokens, before the
    model runs."""
    window = attention_window(encoder, tokenizer, text)
    return window.tokens, attention_run(encoder, window)


class AttentionSteps:
    """The attention maps of texts as the serving scheduler runs them (`inference.jobs.ModelSteps`), so the
    server's attention route goes through the same queue, admission and model thread as every model route:
    one window per text (`attention_window`), one encoder pass per window, and each text's answer
    (tokens, maps [L, N, T, T]). `pipeline`: any served pipeline of the model (each holds its encoder)."""

    def __init__(self, pipeline: Any):
        self.pipeline = pipeline

    @property
    def encoder(self) -> BertModel:
        return encoder_of(self.pipeline.model)

    def features(self, parsed: Sequence[str]) -> list[AttentionWindow]:
        windows = []
        for index, text in enumerate(parsed):
            try:
                windows.append(attention_window(self.encoder, self.pipeline.tokenizer, text))
            except InputError as error:
                raise InputError(f"inputs[{index}]: {error}") from None
        return windows

    def forward(self, features: Sequence[AttentionWindow], options: dict[str, Any]) -> list[torch.Tensor]:
        encoder = self.encoder
        return [attention_run(encoder, window) for window in features]

    def decode(self, parsed: Sequence[str], features: Sequence[AttentionWindow], outputs: Sequence[torch.Tensor],
               options: dict[str, Any]) -> list[tuple[list[str], torch.Tensor]]:
        return [(window.tokens, maps) for window, maps in zip(features, outputs, strict=True)]


def attention_maps(model_dir: str | os.PathLike, text: str) -> tuple[list[str], torch.Tensor]:
    """(tokens [T], attention probabilities [L, N, T, T] in fp32) of `text` under the model in `model_dir`."""
    if not isinstance(text, str) or is_blank(text):
        raise InputError("text is empty; give a sentence to draw the attention of")
    tokenizer = load_tokenizer(model_dir)
    model, _ = registry.load_model(model_dir)
    return attention_of(encoder_of(model), tokenizer, text)


def select(count: int, chosen: int | None, what: str) -> list[int]:
    """Indices to draw: all, or the one asked for (negative counts from the end)."""
    if chosen is None:
        return list(range(count))
    if not -count <= chosen < count:
        raise InputError(f"{what} {chosen} does not exist; the model has {count} (0 to {count - 1})")
    return [chosen % count]


def attention_figure(tokens: list[str], maps: torch.Tensor, layers: list[int], heads: list[int], title: str,
                     font: str | None = None):
    """The grid of maps as a matplotlib Figure (object API, no global pyplot state), with one colour bar.

    Constrained layout places the figure title above the head titles (never over them) and the colour bar
    beside the grid. `font` is a family for the token labels and the title (a CJK font for Chinese text; see
    `plots.cjk_font`), tried before matplotlib's default.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    text_font = {"fontfamily": [font, "sans-serif"]} if font else {}
    size = max(1.6, min(4.0, 0.25 * len(tokens)))
    figure = Figure(figsize=(max(size * len(heads) + 2.0, 5.0), size * len(layers) + 1.2), dpi=100,
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(layers), len(heads), squeeze=False)
    # Token names on the outer edge of the grid only, and only while they stay legible.
    labels = len(tokens) <= 24
    image = None
    for row, layer in enumerate(layers):
        for column, head in enumerate(heads):
            ax = axes[row][column]
            image = ax.imshow(maps[layer, head].numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            if column == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
                if labels:
                    ax.set_yticks(range(len(tokens)), tokens, fontsize=6, **text_font)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=8)
            if labels and row == len(layers) - 1:
                ax.set_xticks(range(len(tokens)), tokens, fontsize=6, rotation=90, **text_font)
    bar = figure.colorbar(image, ax=axes, shrink=0.9 if len(layers) > 1 else 1.0, aspect=30)
    bar.set_label("attention weight (each row sums to 1)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    # A long text would run off both sides of a narrow grid: wrap the title to the figure's width.
    width = int(figure.get_figwidth() * 72 / (10 * 0.62))  # characters of 10-point text per line
    figure.suptitle(textwrap.fill(title, width=max(width, 20)), fontsize=10, **text_font)
    return figure


def render_png(tokens: list[str], maps: torch.Tensor, layers: list[int], heads: list[int], title: str,
               font: str | None = None) -> bytes:
    """`attention_figure` as PNG bytes."""
    from io import BytesIO

    buffer = BytesIO()
    with warnings.catch_warnings():
        # matplotlib warns once per missing character; render_attention has said it once already.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        attention_figure(tokens, maps, layers, heads, title, font).savefig(buffer, format="png")
    return buffer.getvalue()


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Attention: __TITLE__</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-top:1em}
td{width:2.4em;height:2.4em;border:1px solid #eee;text-align:center;font-size:10px;color:transparent}
td:hover{color:#000;outline:2px solid #e66}
th{font-weight:normal;font-size:12px;padding:2px 6px;white-space:nowrap}
th.col{writing-mode:vertical-rl;transform:rotate(180deg);height:6em;text-align:left}
tr.hit th.row{background:#fde68a}
.note{color:#666;font-size:13px;max-width:48em}
</style></head><body>
<h2>Attention of <code>__MODEL__</code></h2>
<p>Text: <b>__TITLE__</b></p>
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
<p class="note">Row = the token that attends, column = the token attended to; each row sums to 1.
Hover a cell for its weight. "mean" averages the heads of the layer.</p>
<table id="map"></table>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const L = document.getElementById("layer"), H = document.getElementById("head"), T = document.getElementById("map");
D.maps.forEach((_, i) => L.add(new Option(String(i), String(i))));
H.add(new Option("mean", "mean"));
D.maps[0].forEach((_, i) => H.add(new Option(String(i), String(i))));
L.value = String(D.layer); H.value = D.head === null ? "mean" : String(D.head);
function matrix() {
  const heads = D.maps[Number(L.value)];
  if (H.value !== "mean") return heads[Number(H.value)];
  return heads[0].map((r, i) => r.map((_, j) => heads.reduce((s, h) => s + h[i][j], 0) / heads.length));
}
function draw() {
  const m = matrix();
  T.textContent = "";
  const top = T.insertRow(); top.appendChild(document.createElement("th"));
  D.tokens.forEach(t => { const th = document.createElement("th"); th.className = "col"; th.textContent = t; top.appendChild(th); });
  m.forEach((r, i) => {
    const tr = T.insertRow();
    const th = document.createElement("th"); th.className = "row"; th.textContent = D.tokens[i]; tr.appendChild(th);
    r.forEach((w, j) => {
      const td = tr.insertCell();
      td.style.background = "rgba(37,99,235," + w.toFixed(3) + ")";
      td.textContent = w.toFixed(2);
      td.title = D.tokens[i] + " \\u2192 " + D.tokens[j] + ": " + w.toFixed(4);
    });
    tr.onmouseenter = () => tr.classList.add("hit"); tr.onmouseleave = () => tr.classList.remove("hit");
  });
}
L.onchange = draw; H.onchange = draw; draw();
</script></body></html>
"""


def render_html(tokens: list[str], maps: torch.Tensor, text: str, model_name: str, layer: int,
                head: int | None) -> str:
    """The interactive page; data inline (4 decimals), `</` escaped so no text can close the script."""
    data = {"tokens": tokens, "layer": layer, "head": head,
            "maps": [[[[round(float(w), 4) for w in row] for row in h] for h in lay] for lay in maps.tolist()]}
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (PAGE.replace("__TITLE__", html.escape(text)).replace("__MODEL__", html.escape(model_name))
            .replace("__DATA__", payload))


def slug(text: str) -> str:
    """A file-name stem from a text: "I have a dream" -> "attention_i_have_a_dream"."""
    words = re.findall(r"\w+", text.lower())
    return "attention_" + ("_".join(words)[:60].strip("_") or "text")


def render_attention(model_dir: str | os.PathLike, text: str, out_dir: str | os.PathLike,
                     layer: int | None = None, head: int | None = None, *, name: str | None = None,
                     model_name: str | None = None, png: bool | None = None) -> dict[str, Path | None]:
    """Write the attention maps of `text` under the model in `model_dir`.

    Args:
        model_dir: any saved model directory (its encoder is used).
        text: one text (at most `MAX_TOKENS` tokens).
        out_dir: where to write (created if needed).
        layer, head: restrict the PNG grid to one layer and/or head (0-based; negative from the end); the
            HTML page opens on them and still holds every map.
        name: file stem (default: "attention_" + the text's words).
        model_name: how the pages name the model (default: the directory's name).
        png: True requires the PNG (matplotlib), False skips it, None writes it when matplotlib is there.

    Returns:
        {"html": path, "png": path or None}.
    """
    tokens, maps = attention_maps(model_dir, text)
    layers = select(maps.shape[0], layer, "layer")
    heads = select(maps.shape[1], head, "head")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or slug(text)
    model_name = model_name or Path(model_dir).name
    result: dict[str, Path | None] = {"html": out / f"{stem}.html", "png": None}
    write_bytes(result["html"], render_html(tokens, maps, text, model_name, layers[0],
                                             None if head is None else heads[0]).encode("utf-8"))
    if png is not False:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            if png:
                raise ConfigError("the PNG needs matplotlib: pip install 'bertforge[plot]'") from None
            log.warning("matplotlib is not installed; wrote %s only (pip install 'bertforge[plot]')", result["html"])
            return result
        title = f"{model_name}: \"{text}\" — rows: layers, columns: heads"
        result["png"] = out / f"{stem}.png"
        font = None
        if needs_cjk_font([text, *tokens]):
            font = cjk_font()
            if font is None:
                log.warning("no font on this machine draws Chinese characters, so %s shows them as boxes; open %s "
                            "instead (a browser has the fonts), or install one (e.g. fonts-noto-cjk) and rerun",
                            result["png"], result["html"])
        write_bytes(result["png"], render_png(tokens, maps, layers, heads, title, font))
    return result


__all__ = ["ATTENTION_TASK", "MAX_TOKENS", "AttentionSteps", "AttentionWindow", "attention_figure", "attention_maps",
           "attention_of", "attention_run", "attention_window", "encoder_of", "render_attention"]
