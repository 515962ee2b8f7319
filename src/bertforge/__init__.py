"""bertforge: BERT end to end — Google-exact WordPiece, encoder and heads, pretraining, fine-tuning, inference.

The package root re-exports the names people reach for first; everything else lives in its component.
Imports here are lazy so that `import bertforge.tokenization` never pulls in torch.
"""

__version__ = "0.1.0"

_LAZY = {
    "BertConfig": "bertforge.model.config",
    "BertModel": "bertforge.model.bert",
    "Tokenizer": "bertforge.tokenization.tokenizer",
    "BertForPretraining": "bertforge.tasks.pretraining",
    "BertForSequenceClassification": "bertforge.tasks.classification",
    "BertForTokenClassification": "bertforge.tasks.token_classification",
    "BertForQuestionAnswering": "bertforge.tasks.question_answering",
    "BertForMultipleChoice": "bertforge.tasks.multiple_choice",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
