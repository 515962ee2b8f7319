"""`bertforge embed` and `bertforge search` from the command line: end to end, a user error, a `kill -9` in
the middle of a run and its rerun, and peak memory that does not grow with the corpus."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bertforge import cli
from bertforge.cli import corpus_commands
from bertforge.retrieval import embed_corpus

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly hex bad jumping frogs near "
         "old rivers and green hills under the pale winter moon").split()
TIMEOUT_S = 300
# One intra-op thread per subprocess: on a shared 2-core machine two OpenMP threads competing with other
# work spin-wait and run many times slower (and every run of one comparison must use the same count).
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
# Peak RSS of an 8x corpus may exceed the 1x one's by this fraction (measured: about 1%). Two bounded caches
# outside this code fill with the corpus and are kept out of the measurement: oneDNN's kernels per batch
# shape (up to 1024, ~35 MiB here; switched off) and the tokenizer's memo of the chunks it has seen (up to
# 500,000; the corpus reuses a fixed set of words, no line numbers).
RSS_MARGIN = 0.10
NO_KERNEL_CACHE = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}


def write_corpus(path: Path, count: int, seed: int = 0, words: tuple[int, int] = (3, 30), numbered: bool = True
                 ) -> Path:
    """`count` lines of random words; `numbered` starts each with its index, so that no two are equal."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            start = f"{i} " if numbered else ""
            handle.write(start + " ".join(rng.choice(WORDS, size=int(rng.integers(*words)))) + "\n")
    return path


def bertforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertforge", *args]


def embed_args(model: Path, inputs: Path, out: Path, *extra: str) -> list[str]:
    return ["embed", "--model", str(model), "--input", str(inputs), "--out", str(out), "--device", "cpu", *extra]


def test_embed_cli_then_search_end_to_end(tiny_minilm_model, tmp_path, capsys):
    inputs = write_corpus(tmp_path / "corpus.txt", 30)
    texts = inputs.read_text(encoding="utf-8").splitlines()
    assert cli.main(embed_args(tiny_minilm_model, inputs, tmp_path / "index", "--shard-size", "8",
                               "--normalize", "--dtype", "float16")) == 0
    assert "30 vectors (32 dims, float16, cosine similarity) in 4 shards" in capsys.readouterr().err
    (tmp_path / "queries.txt").write_text(f"{texts[4]}\n\n{texts[29]}\n", encoding="utf-8")
    assert cli.main(["search", "--index", str(tmp_path / "index"), "--queries", str(tmp_path / "queries.txt"),
                     "--top-k", "3", "--device", "cpu"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query"] for line in lines] == [texts[4], texts[29]]
    assert [line["hits"][0]["id"] for line in lines] == ["5", "30"] and all(len(x["hits"]) == 3 for x in lines)
    assert lines[0]["hits"][0]["score"] == pytest.approx(1.0, abs=2e-3)  # float16 vectors: cosine ~ 1
    assert cli.main(["search", "--index", str(tmp_path / "index"), "--query", texts[0], "--query", "moon",
                     "--device", "cpu"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query"] for line in lines] == [texts[0], "moon"] and len(lines[1]["hits"]) == 10


def test_embed_cli_sparse_then_search_and_hybrid_search(tiny_sparse_model, tmp_path, capsys):
    inputs = write_corpus(tmp_path / "corpus.txt", 12)
    texts = inputs.read_text(encoding="utf-8").splitlines()
    assert cli.main(embed_args(tiny_sparse_model, inputs, tmp_path / "sparse", "--sparse", "--max-terms", "64",
                               "--shard-size", "5")) == 0
    assert "12 sparse vectors (64.0 terms per text of 30522) in 3 shards" in capsys.readouterr().err
    assert (tmp_path / "sparse" / "inverted" / "inverted.json").is_file()  # built by embed, beside the shards
    assert cli.main(embed_args(tiny_sparse_model, inputs, tmp_path / "dense")) == 0
    capsys.readouterr()
    assert cli.main(["search", "--index", str(tmp_path / "sparse"), "--query", texts[3], "--top-k", "2",
                     "--show-text", "--device", "cpu"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [hit["id"] for hit in hits][0] == "4" and hits[0]["text"] == texts[3] and len(hits) == 2
    assert cli.main(["search", "--index", str(tmp_path / "dense"), "--hybrid", str(tmp_path / "sparse"),
                     "--query", texts[3], "--rrf-k", "10", "--top-k", "3", "--device", "cpu"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0] == {"id": "4", "score": pytest.approx(2 / 11), "dense_rank": 1, "sparse_rank": 1}
    assert cli.main(["search", "--index", str(tmp_path / "sparse"), "--hybrid", str(tmp_path / "dense"),
                     "--query", texts[3], "--rrf-k", "10", "--top-k", "3", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"] == hits  # the kinds fuse in either order


def test_embed_cli_user_error_exits_2_with_one_line(tiny_minilm_model, tmp_path):
    inputs = write_corpus(tmp_path / "corpus.txt", 6)
    first = subprocess.run(bertforge(*embed_args(tiny_minilm_model, inputs, tmp_path / "out")), capture_output=True,
                           text=True, timeout=TIMEOUT_S, check=False, env=ONE_THREAD)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(bertforge(*embed_args(tiny_minilm_model, inputs, tmp_path / "out", "--pooling", "cls")),
                           capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=ONE_THREAD)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"bertforge embed: error: {tmp_path / 'out'} holds vectors made differently (pooling 'mean' -> 'cls'); "
        "rerun with the same model, options and input to resume, or choose another --out (or delete the folder) "
        "to start over"]


def test_embed_cli_flag_choices_are_the_modules_own():
    assert corpus_commands.DTYPE_CHOICES == embed_corpus.DTYPES
    assert corpus_commands.FORMAT_CHOICES == embed_corpus.INPUT_FORMATS
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"embed", "search"} <= set(sub.choices)


def test_embed_cli_kill_9_after_the_first_shard_then_rerun_is_byte_identical(tiny_minilm_model, tmp_path):
    inputs = write_corpus(tmp_path / "corpus.txt", 6_000, words=(10, 40))
    args = bertforge(*embed_args(tiny_minilm_model, inputs, tmp_path / "killed", "--shard-size", "200"))
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ONE_THREAD)
    first_record = tmp_path / "killed" / "progress" / "shard-00000.json"
    deadline = time.monotonic() + TIMEOUT_S
    while not first_record.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()[-2000:]
    manifest = json.loads((tmp_path / "killed" / "manifest.json").read_text(encoding="utf-8"))
    assert not manifest["complete"], "the run finished before the kill: make the corpus bigger"

    rerun = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=ONE_THREAD)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    whole = subprocess.run(bertforge(*embed_args(tiny_minilm_model, inputs, tmp_path / "whole", "--shard-size",
                                                 "200")), capture_output=True, text=True, timeout=TIMEOUT_S,
                           check=False, env=ONE_THREAD)
    assert whole.returncode == 0, whole.stderr[-2000:]

    def files(out: Path) -> dict[str, bytes]:
        return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    killed, reference = files(tmp_path / "killed"), files(tmp_path / "whole")
    assert len([name for name in reference if name.startswith("vectors-")]) == 30
    assert killed == reference  # shards, ids, records and manifest; no temporary file left


def peak_rss_kib(command: list[str]) -> int:
    """Peak resident memory (KiB) of `command`, run in a fresh wrapper process so that each measurement
    covers that one child alone (`RUSAGE_CHILDREN` of the wrapper)."""
    wrapper = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    result = subprocess.run([sys.executable, "-c", wrapper, *command], capture_output=True, text=True,
                            timeout=TIMEOUT_S, check=False,
                            env={**ONE_THREAD, **NO_KERNEL_CACHE})
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.split()[-1])


def test_embed_cli_peak_memory_is_flat_in_corpus_size(tiny_minilm_model, tmp_path):
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0  # Linux reports KiB
    peaks = {}
    for times in (1, 8):
        inputs = write_corpus(tmp_path / f"corpus{times}.txt", 5_000 * times, seed=times, words=(20, 60),
                              numbered=False)
        peaks[times] = peak_rss_kib(bertforge(*embed_args(tiny_minilm_model, inputs, tmp_path / f"out{times}",
                                                         "--shard-size", "1000")))
    print(f"peak RSS: 1x {peaks[1] / 1024:.0f} MiB, 8x {peaks[8] / 1024:.0f} MiB")
    assert peaks[8] <= peaks[1] * (1 + RSS_MARGIN), peaks


# --- long texts: cut to the window and said, or refused (issue #46) ------------------------------------------

def write_long_and_short(path: Path) -> tuple[Path, list[str]]:
    """Six lines, lines 2, 4 and 5 (1-based) far longer than the tiny model's window."""
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=size)) for size in (5, 400, 7, 300, 500, 6)]
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path, texts


def test_embed_cli_cuts_long_texts_and_counts_them_in_progress_summary_and_manifest(tiny_minilm_model, tmp_path,
                                                                                      capsys, caplog):
    from bertforge.inference.pipelines import load_pipeline

    inputs, texts = write_long_and_short(tmp_path / "articles.txt")
    out = tmp_path / "index"
    with caplog.at_level("INFO"):
        assert cli.main(embed_args(tiny_minilm_model, inputs, out, "--shard-size", "4", "--batch-size", "2")) == 0
    summary = capsys.readouterr().err
    assert "3 of 6 texts were longer than the model's window" in summary and "--chunk" in summary
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["truncated"] == 3 and manifest["settings"]["truncate"] is True
    assert [shard["truncated"] for shard in manifest["shards"]] == [2, 1]  # lines 2, 4 | line 5
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("text ")]
    assert progress and "truncated=3" in progress[-1]  # the progress line counts them too
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"{inputs}:2" in w and "cut to it" in w for w in warnings)  # the first cut text, by its line
    # The cut is the model's window, as every embedding route of the server cuts: the same vectors as encode.
    vectors = np.concatenate([np.load(out / shard["vectors"]) for shard in manifest["shards"]])
    expected = load_pipeline(tiny_minilm_model, "embed", device="cpu").encode(texts)
    assert np.abs(vectors - expected).max() < 1e-5


def test_embed_cli_truncate_false_refuses_naming_the_line_before_any_model_call(tiny_minilm_model, tmp_path,
                                                                                  capsys, monkeypatch):
    from bertforge.inference.pipelines import Pipeline

    inputs, _ = write_long_and_short(tmp_path / "articles.txt")
    calls = []
    real = Pipeline.forward
    monkeypatch.setattr(Pipeline, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(Pipeline, "stream", lambda *a, **k: calls.append(1))
    code = cli.main(embed_args(tiny_minilm_model, inputs, tmp_path / "index", "--truncate", "false"))
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1, error
    assert f"{inputs}:2:" in error[0] and "tokens; this model takes at most" in error[0]
    assert "--chunk TOKENS" in error[0] and "--truncate false" in error[0]
    assert calls == []  # refused from the tokens alone: the model never ran (not even the width probe)


def test_embed_cli_sparse_counts_cut_texts_too(tiny_sparse_model, tmp_path, capsys):
    inputs, _ = write_long_and_short(tmp_path / "articles.txt")
    out = tmp_path / "sparse"
    assert cli.main(embed_args(tiny_sparse_model, inputs, out, "--sparse")) == 0
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8"))["truncated"] == 3
    assert "3 of 6 texts were longer" in capsys.readouterr().err
