"""Data: corpus reading, pretraining instances and shards, masking, batching, and the task readers.

Imports are lazy so that preparing data (`prepare_corpus`, which runs in worker processes too) never pulls in
torch; only batching (`collate`, `datasets`) needs it.
"""

from bertforge.lazy import lazy_getattr

_LAZY = {
    "Document": "bertforge.data.corpus",
    "CorpusStats": "bertforge.data.corpus",
    "read_documents": "bertforge.data.corpus",
    "split_sentences": "bertforge.data.sentences",
    "assign_documents": "bertforge.data.corpus",
    "create_instances": "bertforge.data.pretraining",
    "jieba_segmenter": "bertforge.data.pretraining",
    "prepare_corpus": "bertforge.data.preparation",
    "PrepareReport": "bertforge.data.preparation_report",
    "Part": "bertforge.data.preparation_parts",
    "merge_parts": "bertforge.data.preparation_parts",
    "ShardIndex": "bertforge.data.shards",
    "vocab_checksum": "bertforge.data.shards",
    "MaskingConfig": "bertforge.data.masking",
    "Masker": "bertforge.data.masking",
    "PretrainingBatch": "bertforge.data.collate",
    "PretrainingExample": "bertforge.data.collate",
    "collate_pretraining": "bertforge.data.collate",
    "pad_sequences": "bertforge.data.collate",
    "PretrainingData": "bertforge.data.datasets",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
