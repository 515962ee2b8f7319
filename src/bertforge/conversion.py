"""`bertforge convert`: any BERT checkpoint we can read, written as our usual model directory.

Sources: a Google release directory (`bert_config.json`, `vocab.txt`, `bert_model.ckpt.*`), a
`run_pretraining.py` output directory (`model.ckpt-NNNN.*`, the `checkpoint` file naming the latest; `step`
picks another), or a Hugging Face directory (`config.json` with `model.safetensors` or `pytorch_model.bin`).
The destination is a Hugging Face BERT checkpoint (`config.json`, `model.safetensors`, `vocab.txt`,
`tokenizer_config.json` with the casing), written atomically; the class is the one the source's heads call
for (`families.registry`), so a pretraining checkpoint keeps its MLM and NSP heads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bertforge import checkpoint_format
from bertforge.families import registry


@dataclass
class ConversionReport:
    """What `convert` read and wrote: the source weights file, the class written, tensors read and skipped
    (optimizer slots, another task's head), the parameter count and the tokenizer's casing."""

    source: str
    destination: Path
    architecture: str
    tensors: int
    skipped: int
    parameters: int
    do_lower_case: bool | None

    def summary(self) -> str:
        casing = {None: "no tokenizer", True: "lower-cased", False: "cased"}[self.do_lower_case]
        return (f"{self.source} -> {self.destination}: {self.architecture}, {self.tensors} tensors read, "
                f"{self.skipped} skipped, {self.parameters:,} parameters; tokenizer {casing}")


def convert(source: str | os.PathLike, destination: str | os.PathLike, *, step: int | None = None,
            do_lower_case: bool | None = None, tokenizer: str | os.PathLike | None = None) -> ConversionReport:
    """Read `source` (see the module docstring) and write it to `destination` as our model directory.

    Args:
        source: the checkpoint directory.
        destination: the directory to write (replaced atomically if it exists).
        step: a run_pretraining.py step (default: the one the `checkpoint` file names).
        do_lower_case: override the tokenizer's casing (default: the source's, or Google's naming rule).
        tokenizer: a directory to take the tokenizer from when `source` has none (run_pretraining.py leaves
            no vocab.txt: give the release directory the run started from).
    """
    directory = checkpoint_format.read_directory(source, do_lower_case=do_lower_case)
    vocabulary = directory.tokenizer
    if tokenizer is not None:
        vocabulary = checkpoint_format.load_tokenizer(tokenizer, do_lower_case=do_lower_case)
    model, report = registry.load_model(source, registry.model_class(directory.architecture), step=step,
                                        fast_path=False)
    checkpoint_format.save_model(model, destination, tokenizer=vocabulary)
    tensors = len(model.state_dict()) - len(report.fresh)
    casing = None if vocabulary is None else bool(vocabulary.config.do_lower_case)
    return ConversionReport(report.source, Path(destination), type(model).__name__, tensors, len(report.skipped),
                            sum(p.numel() for p in model.parameters()), casing)
