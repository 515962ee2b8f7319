"""Google-exact BERT WordPiece tokenization with character offsets (pure Python; never imports torch).

Public API: `Tokenizer`, `TokenizerConfig`, `Encoding`, `Vocab`, `build_vocab`, `unk_rate`, and
`pair_windows` (the one pair-windowing policy, `pairs`).
"""

from bertforge.tokenization.encoding import Encoding
from bertforge.tokenization.pairs import PairWindow, PairWindows, pair_windows
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.tokenizer_files import TokenizerConfig
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.vocab_builder import build_vocab, unk_rate

__all__ = [
    "Encoding",
    "PairWindow",
    "PairWindows",
    "Tokenizer",
    "TokenizerConfig",
    "Vocab",
    "build_vocab",
    "pair_windows",
    "unk_rate",
]
