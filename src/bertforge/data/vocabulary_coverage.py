"""Whether a model's vocabulary covers a data set: the share of `[UNK]` among the tokens of its features.

A vocabulary made for another language or script (an English checkpoint on Chinese text) turns most tokens
into `[UNK]`: training and evaluation still run, the model just cannot see the words, and nothing else says so.
`fine-tune` and `evaluate` measure the share on a sample of the features they already built (before the model
loads) and warn once when it is above `UNKNOWN_SHARE_LIMIT`, naming the cause and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

log = logging.getLogger("bertforge.data")

# Above this share of [UNK] among the real tokens, the vocabulary does not cover the text. A well-matched
# vocabulary stays far below it (MiniLM's English WordPiece on English GLUE text: well under 1%), and an
# English one on Chinese text is far above (ChnSentiCorp: 63% with MiniLM).
UNKNOWN_SHARE_LIMIT = 0.05
# Features sampled (spread evenly over the list): enough for a stable share, cheap on any data set.
SAMPLE_FEATURES = 2000


def unknown_share(features: Sequence[Any], tokenizer: Any, sample: int = SAMPLE_FEATURES) -> tuple[float, int]:
    """(share of `[UNK]` among the non-special tokens, tokens counted) over up to `sample` features taken
    evenly from `features` (each with `input_ids`: [T], or [C][T] for multiple choice)."""
    if not features:
        return 0.0, 0
    picked = np.unique(np.linspace(0, len(features) - 1, min(sample, len(features))).astype(int))
    unk = tokenizer.unk_token_id
    # [CLS], [SEP], [PAD] ... are not text; [UNK] is (it stands for a word the vocabulary lacks).
    layout = np.asarray([i for i in tokenizer.all_special_ids if i != unk])
    unknown = tokens = 0
    for index in picked:
        ids = _flat(features[index].input_ids)
        text = ids[~np.isin(ids, layout)]
        tokens += int(text.size)
        unknown += int((text == unk).sum())
    return (unknown / tokens if tokens else 0.0), tokens


def _flat(ids: Any) -> np.ndarray:
    """One feature's token ids as one array: [T], or the rows of [C][T] (choices of different lengths) joined."""
    if len(ids) and not np.isscalar(ids[0]):
        return np.concatenate([np.asarray(row).ravel() for row in ids])
    return np.asarray(ids).ravel()


def warn_if_uncovered(features: Sequence[Any], tokenizer: Any, where: str) -> float:
    """Log one warning when the sampled `[UNK]` share of `features` is above `UNKNOWN_SHARE_LIMIT`; returns
    the share. `where` names the data ("chnsenticorp train", a file)."""
    share, tokens = unknown_share(features, tokenizer)
    if share > UNKNOWN_SHARE_LIMIT:
        log.warning("%s: %.1f%% of the tokens are [UNK] (%d sampled tokens): the model's vocabulary (%d tokens) "
                    "does not cover this text's language or script (e.g. an English checkpoint on Chinese text), so "
                    "the model cannot see those words. Use a checkpoint made for the language: for Chinese, Google's "
                    "chinese_L-12_H-768_A-12 converted with `bertforge convert chinese_L-12_H-768_A-12 --out DIR` "
                    "(docs/faq.md), then --model DIR", where, 100 * share, tokens, tokenizer.vocab_size)
    return share
