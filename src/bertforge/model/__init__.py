"""The BERT encoder, its configuration and the reusable heads (row 0: no tokenization, data or training)."""

from bertforge.model.bert import BertModel, BertOutput
from bertforge.model.config import PRESETS, BertConfig

__all__ = ["PRESETS", "BertConfig", "BertModel", "BertOutput"]
