"""Constants shared across bertforge: special tokens, the label ignore index and artifact file names."""

from __future__ import annotations

# Cross-entropy targets equal to this are ignored (PyTorch's default ignore_index, and Hugging Face's).
IGNORE_INDEX = -100

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
# The order in which a freshly built vocabulary lists them (Google's vocabularies put [PAD] at 0).
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)

# Files of a saved model directory (an artifact); the names are those a Hugging Face BERT checkpoint uses.
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"
VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
TRAINING_STATE_NAME = "training_state.pt"
# sha256 and size of each weights file (and training state), written by bertforge, verified on load.
CHECKSUMS_NAME = "checksums.json"
# How a fine-tuned model built its inputs (max length, windows, label scheme): read back by evaluate/predict.
FINETUNING_NAME = "finetuning.json"

# NSP labels (Google's convention): 0 = segment B really follows A, 1 = B is a random sentence.
NSP_IS_NEXT = 0
NSP_IS_RANDOM = 1
