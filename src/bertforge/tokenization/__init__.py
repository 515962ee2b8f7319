"""Google-exact BERT WordPiece tokenization with character offsets (pure Python; never imports torch).

Public API: `Tokenizer`, `TokenizerConfig`, `Encoding`, `Vocab`, `build_vocab`, `unk_rate`.
"""

from bertforge.tokenization.tokenizer import Encoding, Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab
from bertforge.tokenization.vocab_builder import build_vocab, unk_rate

__all__ = ["Encoding", "Tokenizer", "TokenizerConfig", "Vocab", "build_vocab", "unk_rate"]
