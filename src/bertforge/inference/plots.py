"""Training curves of a run: loss and accuracy against step, one line per split, from `metrics.jsonl`.

A run directory's `metrics.jsonl` holds one JSON object per line with "step", "split" (e.g. "train",
"eval") and metric values, either at the top level or under "values" (the training logger's layout:
``{"step": 100, "split": "train", "time": ..., "values": {"loss": ..., "mlm_acc": ...}}``). `plot_run` draws every metric whose name contains "loss" in one panel and every
one containing "acc" (accuracy, mlm_accuracy, nsp_accuracy ...) in another, plus any metrics named
explicitly, and writes a PNG next to the metrics. Needs matplotlib (the `plot` extra).

It also owns the figure conventions the attention grid shares (`inference.attention`): constrained layout,
so a figure title never overlaps the panel titles, and the choice of a font that draws CJK text
(`cjk_font`): matplotlib's default DejaVu Sans has no Chinese or Japanese glyphs and draws each character
as an empty box, so a machine's Noto Sans CJK / Source Han / WenQuanYi / SimHei / Microsoft YaHei /
PingFang (or any installed font with a glyph for 中) is used when the text needs one.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from io import BytesIO
from pathlib import Path
from typing import Any

from bertforge.errors import ConfigError, DataError
from bertforge.storage import write_bytes
from bertforge.tokenization.normalizer import is_cjk

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"

# Font families that draw Chinese (and Japanese/Korean) characters, most preferred first; a font whose name
# contains one of these is taken without opening its file.
CJK_FONT_NAMES = ("Noto Sans CJK", "Noto Sans SC", "Noto Sans TC", "Source Han Sans", "Noto Serif CJK",
                  "Source Han Serif", "WenQuanYi", "SimHei", "Microsoft YaHei", "PingFang", "Hiragino Sans GB",
                  "Heiti", "STHeiti", "SimSun", "AR PL", "Droid Sans Fallback", "Arial Unicode")
CJK_PROBE = "中"  # a character every CJK font has


def needs_cjk_font(texts: Iterable[str]) -> bool:
    """Whether any of `texts` holds a CJK ideograph (Google's ranges, as the tokenizer splits them)."""
    return any(is_cjk(ord(char)) for text in texts for char in text)


def has_glyph(font_file: str, char: str) -> bool:
    """Whether the font file has a glyph for `char` (False for a file matplotlib cannot open)."""
    try:
        from matplotlib.ft2font import FT2Font

        return FT2Font(font_file).get_char_index(ord(char)) != 0
    except (OSError, RuntimeError, ValueError):
        return False


def cjk_font(fonts: Iterable[Any] | None = None) -> str | None:
    """The family name of an installed font that draws CJK characters, or None when the machine has none.

    Args:
        fonts: font entries with `.name` and `.fname` (default: matplotlib's font list,
            `font_manager.fontManager.ttflist`; tests pass their own).

    A font named in `CJK_FONT_NAMES` wins (in that order); otherwise the first font whose file has a glyph
    for 中. The answer for the machine's own list is remembered (reading font files is slow).
    """
    if fonts is None:
        return _installed_cjk_font()
    entries = sorted(fonts, key=lambda entry: entry.name)
    for wanted in CJK_FONT_NAMES:
        for entry in entries:
            if wanted.lower() in entry.name.lower():
                return entry.name
    for entry in entries:
        if has_glyph(entry.fname, CJK_PROBE):
            return entry.name
    return None


@functools.lru_cache(maxsize=1)
def _installed_cjk_font() -> str | None:
    from matplotlib import font_manager

    return cjk_font(font_manager.fontManager.ttflist)


def read_metrics(path: Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{metric: {split: [(step, value), ...]}} from a metrics.jsonl file (non-numeric fields are ignored)."""
    if not path.is_file():
        raise DataError(f"no {METRICS_FILE} here; pass a run directory written by training", path)
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines) and not line.endswith("\n"):
                break  # the line a running (or crashed) job is still writing
            raise DataError(f"not valid JSON ({error.msg})", path, number) from None
        if not isinstance(record, dict) or "step" not in record:
            raise DataError('expected an object with "step", "split" and metric values', path, number)
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int | float):
            raise DataError(f'"step" must be a number, got {step!r}', path, number)
        split = str(record.get("split", "train"))
        values = record["values"] if isinstance(record.get("values"), dict) else record
        for name, value in values.items():
            if name in ("step", "split", "time") or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                series[name][split].append((float(step), float(value)))
    return series


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None,
             metrics: list[str] | None = None) -> Path:
    """Draw the loss and accuracy curves of a run.

    Args:
        run_dir: a run directory holding metrics.jsonl (or the path of the file itself).
        out: PNG path (default: `curves.png` in the run directory).
        metrics: further metric names to draw in their own panels (e.g. ["f1", "lr"]).

    Returns:
        The PNG's path.

    Raises:
        DataError: the file is missing or malformed, or holds no loss/accuracy values.
        ConfigError: matplotlib is not installed.
    """
    run = Path(run_dir)
    path = run if run.is_file() else run / METRICS_FILE
    series = read_metrics(path)
    panels = [("loss", sorted(n for n in series if "loss" in n)),
              ("accuracy", sorted(n for n in series if "acc" in n and "loss" not in n))]
    for name in metrics or []:
        if name not in series:
            raise DataError(f"metric {name!r} is not in the file; it has {sorted(series)}", path)
        panels.append((name, [name]))
    panels = [(title, names) for title, names in panels if names]
    if not panels:
        raise DataError(f"no loss or accuracy values to draw (metrics found: {sorted(series) or 'none'})", path)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'bertforge[plot]'") from None

    # Constrained layout leaves room for the figure title above the panel titles (tight_layout does not).
    figure = Figure(figsize=(6.0 * len(panels), 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, names) in zip(axes, panels):
        for name in names:
            for split, points in sorted(series[name].items()):
                points.sort()
                ax.plot([s for s, _ in points], [v for _, v in points], label=f"{name} ({split})",
                        marker="o" if len(points) < 30 else None, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(str(run.resolve().name if run.is_dir() else run.parent.name), fontsize=10)
    target = Path(out) if out is not None else path.parent / CURVES_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = BytesIO()
    figure.savefig(buffer, format="png")
    write_bytes(target, buffer.getvalue())
    return target


__all__ = ["CJK_FONT_NAMES", "CURVES_FILE", "METRICS_FILE", "cjk_font", "needs_cjk_font", "plot_run",
           "read_metrics"]
