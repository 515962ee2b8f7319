"""Figure conventions of the PNGs: a CJK-capable font for Chinese text (or one warning pointing to the HTML
page), a colour bar on the attention grid, and a figure title that never overlaps the panel titles."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bertforge.inference import attention, plots
from bertforge.inference.plots import cjk_font, has_glyph, needs_cjk_font

matplotlib = pytest.importorskip("matplotlib")
DEJAVU = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def fonts(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=name, fname=f"/fonts/{name.replace(' ', '')}.ttf") for name in names]


def test_cjk_font_prefers_a_known_cjk_family():
    installed = fonts("DejaVu Sans", "WenQuanYi Zen Hei", "Noto Sans CJK JP", "STIXGeneral")
    assert cjk_font(installed) == "Noto Sans CJK JP"
    assert cjk_font(fonts("DejaVu Sans", "Microsoft YaHei")) == "Microsoft YaHei"


def test_cjk_font_falls_back_to_any_font_with_a_glyph_for_zhong(monkeypatch):
    monkeypatch.setattr(plots, "has_glyph", lambda path, char: path == "/fonts/MyHanzi.ttf" and char == "中")
    assert cjk_font(fonts("DejaVu Sans", "My Hanzi")) == "My Hanzi"
    monkeypatch.setattr(plots, "has_glyph", lambda path, char: False)
    assert cjk_font(fonts("DejaVu Sans", "cmr10")) is None


def test_cjk_font_glyph_check_reads_the_font_file():
    assert has_glyph(str(DEJAVU), "A") and not has_glyph(str(DEJAVU), "中")
    assert not has_glyph("/no/such/font.ttf", "A")


def test_cjk_font_needed_only_for_text_with_cjk_characters():
    assert needs_cjk_font(["[CLS]", "我", "[SEP]"]) and not needs_cjk_font(["i have a dream", "héllo"])


def grid(layers: int, heads: int, tokens: list[str], font: str | None = None, title: str | None = None):
    shape = (layers, heads, len(tokens), len(tokens))
    maps = torch.softmax(torch.randn(shape, generator=torch.Generator().manual_seed(0)), -1)
    title = title or 'model: "' + " ".join(tokens) + '" — rows: layers, columns: heads'
    figure = attention.attention_figure(tokens, maps, list(range(layers)), list(range(heads)), title, font)
    figure.canvas.draw()
    return figure


@pytest.mark.parametrize("layers, heads, length, title", [
    (1, 1, 6, "a long text, " * 12),
    (2, 3, 6, None),
    (6, 12, 30, None),  # tall grid, token labels off: tight_layout put the title over the head titles
])
def test_attention_figure_title_clears_the_head_titles_and_has_a_colour_bar(layers, heads, length, title):
    figure = grid(layers, heads, ["[CLS]", *(f"w{i}" for i in range(length - 2)), "[SEP]"], title=title)
    renderer = figure.canvas.get_renderer()
    box = figure._suptitle.get_window_extent(renderer)
    head_titles = [ax.title.get_window_extent(renderer) for ax in figure.axes if ax.get_title()]
    assert len(head_titles) == heads
    assert all(box.y0 >= head.y1 for head in head_titles)  # above every head title, not over one
    assert 0 <= box.x0 and box.x1 <= figure.bbox.width  # inside the figure, wrapped when long
    bars = [ax for ax in figure.axes if hasattr(ax, "_colorbar")]
    assert len(bars) == 1 and len(figure.axes) == layers * heads + 1
    assert bars[0].get_ylim() == (0.0, 1.0)


@pytest.mark.filterwarnings("ignore:Glyph")
def test_attention_figure_draws_tokens_and_title_in_the_chosen_font():
    figure = grid(1, 2, ["[CLS]", "我", "有", "[SEP]"], font="DejaVu Sans Mono")
    ax = figure.axes[0]
    assert ax.get_yticklabels()[1].get_fontfamily()[0] == "DejaVu Sans Mono"
    assert figure._suptitle.get_fontfamily()[0] == "DejaVu Sans Mono"


def test_render_attention_without_cjk_font_warns_once_and_names_the_html_page(tiny_minilm_model, tmp_path,
                                                                              monkeypatch, caplog):
    monkeypatch.setattr(attention, "cjk_font", lambda: None)
    with caplog.at_level(logging.WARNING, logger="bertforge.inference.attention"):
        paths = attention.render_attention(tiny_minilm_model, "我有一个梦想", tmp_path, name="zh")
        attention.render_attention(tiny_minilm_model, "i have a dream", tmp_path, name="en")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(paths["html"]) in warnings[0] and "boxes" in warnings[0]
    assert paths["png"].exists()


def test_render_attention_with_a_cjk_font_uses_it_silently(tiny_minilm_model, tmp_path, monkeypatch, caplog):
    chosen = []
    monkeypatch.setattr(attention, "cjk_font", lambda: "DejaVu Sans")
    real = attention.render_png
    monkeypatch.setattr(attention, "render_png", lambda *args: chosen.append(args[-1]) or real(*args))
    with caplog.at_level(logging.WARNING, logger="bertforge.inference.attention"):
        attention.render_attention(tiny_minilm_model, "北京", tmp_path)
        attention.render_attention(tiny_minilm_model, "paris", tmp_path)
    assert chosen == ["DejaVu Sans", None] and not caplog.records
