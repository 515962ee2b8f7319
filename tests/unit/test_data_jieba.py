"""jieba's dictionary-loading lines ("Building prefix dict ...", "Loading model cost ...") print at most once
per run: not per segmenter, not per `prepare --workers N` process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOVEL = ROOT / "data" / "demo" / "zh" / "xiyouji.txt"

SCRIPT = textwrap.dedent('''
    import logging, pickle, sys
    from pathlib import Path

    from bertforge.data.pretraining import jieba_segmenter
    from bertforge.data.preparation import prepare_corpus
    from bertforge.tokenization.tokenizer import Tokenizer

    if __name__ == "__main__":
        # As the command line sets logging up: a root handler that would print jieba's debug records too.
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(message)s")
        corpus, vocab, out = map(Path, sys.argv[1:4])
        first, second = jieba_segmenter(), jieba_segmenter()
        assert first("我们喜欢北京") == ["我们", "喜欢", "北京"] and second("孙悟空") == ["孙悟空"]
        pickle.loads(pickle.dumps(first))("花果山")
        report = prepare_corpus([str(corpus)], Tokenizer.from_pretrained(vocab), str(out), max_seq_length=64,
                                workers=2, segmenter=first, shard_size=3000)
        print(report.summary())
''')


def test_jieba_segmenter_loads_its_dictionary_quietly_once_per_run(tmp_path, minilm_path):
    pytest.importorskip("jieba")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = NOVEL.read_text(encoding="utf-8")[:12_000]
    for index in range(3):  # several files and shards, so both worker processes segment text
        (corpus / f"part{index}.txt").write_text(text[index * 4000:(index + 1) * 4000], encoding="utf-8")
    script = tmp_path / "prepare_zh.py"
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(corpus), str(minilm_path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Building prefix dict" not in done.stderr and "Loading model cost" not in done.stderr, done.stderr
    assert done.stderr.count("jieba word segmenter ready") == 1, done.stderr
    # The segmenter travelled to the workers: the shards carry jieba's word boundaries.
    assert "instances" in done.stdout
