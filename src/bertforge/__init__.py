"""bertforge: BERT end to end — Google-exact WordPiece, encoder and heads, pretraining, fine-tuning, inference.

The package root re-exports the names people reach for first; everything else lives in its component.
Imports here are lazy so that `import bertforge.tokenization` never pulls in torch.
"""

__version__ = "0.1.0"

from bertforge.lazy import lazy_getattr

_LAZY = {
    "BertConfig": "bertforge.model.config",
    "BertModel": "bertforge.model.bert",
    "Tokenizer": "bertforge.tokenization.tokenizer",
    "BertForPretraining": "bertforge.families.pretraining",
    "BertForMaskedLM": "bertforge.families.pretraining",
    "BertForSequenceClassification": "bertforge.families.classification",
    "BertForTokenClassification": "bertforge.families.tagging",
    "BertForQuestionAnswering": "bertforge.families.question_answering",
    "BertForMultipleChoice": "bertforge.families.multiple_choice",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["__version__", *_LAZY]
