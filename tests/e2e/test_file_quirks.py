"""The files people have, through the command line: `bertforge finetune` and `bertforge evaluate` on an
MRPC file written exactly as GLUE ships it (a UTF-8 byte-order mark, the header
``Quality\\t#1 ID\\t#2 ID\\t#1 String\\t#2 String``, CRLF line ends), and the clear one-line errors for the
files that cannot be read (Latin-1, header only, a stray tab).

The model is a tiny random BERT with the vocabulary of the bundled MiniLM checkpoint: the claim is that the
files are read, not that the model learns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main

BOM = b"\xef\xbb\xbf"
HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
PAIRS = [
    ("1", "Amrozi accused his brother , whom he called \" the witness \" , of distorting evidence .",
     "Referring to him as only \" the witness \" , Amrozi accused his brother of distorting evidence ."),
    ("0", "Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 .",
     "Yucaipa bought Dominick 's in 1995 for $ 693 million ."),
    ("1", "They had published an advertisement on the Internet on June 10 .",
     "On June 10 , the ship 's owners had published an advertisement on the Internet ."),
    ("0", "Around 0335 GMT , Tab shares were up 19 cents at $ 4.56 .",
     "Tab shares jumped 20 cents , or 4.6 % , to set a record closing high at A $ 4.57 ."),
]


def mrpc_bytes(rows: int = 12, header: bool = True) -> bytes:
    """An MRPC file as GLUE ships it: BOM, the header, tab-separated rows, CRLF line ends."""
    lines = [HEADER] if header else []
    for i in range(rows):
        quality, first, second = PAIRS[i % len(PAIRS)]
        lines.append(f"{quality}\t{1000 + i}\t{2000 + i}\t{first}\t{second}")
    return BOM + "".join(line + "\r\n" for line in lines).encode("utf-8")


@pytest.fixture(scope="module")
def tiny_model(tiny_minilm_model) -> Path:
    return tiny_minilm_model


def finetune(model: Path, train: Path, dev: Path, out: Path) -> int:
    return main(["finetune", "--format", "pair", "--train", str(train), "--dev", str(dev), "--model", str(model),
                 "--out", str(out), "--text-a", "#1 String", "--text-b", "#2 String", "--label", "Quality",
                 "--epochs", "1", "--batch-size", "8", "--max-seq-length", "32", "--device", "cpu",
                 "--precision", "fp32"])


def test_finetune_and_evaluate_mrpc_as_glue_ships_it(tiny_model, tmp_path):
    data = tmp_path / "msr_paraphrase_train.txt"
    data.write_bytes(mrpc_bytes())
    assert data.read_bytes().startswith(BOM) and b"\r\n" in data.read_bytes()
    assert finetune(tiny_model, data, data, tmp_path / "run") == 0
    (record,) = (tmp_path / "run").rglob("finetuning.json")
    best = record.parent
    config = json.loads((best / "config.json").read_text(encoding="utf-8"))
    assert sorted(config["id2label"].values()) == ["0", "1"]  # not "\ufeff..." or "1\r"

    assert main(["evaluate", "--model", str(best), "--data", str(data), "--out", str(tmp_path / "eval"),
                 "--device", "cpu", "--precision", "fp32"]) == 0
    predictions = [json.loads(line) for line in
                   (tmp_path / "eval" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(predictions) == 12
    assert all(prediction["label"] in ("0", "1") for prediction in predictions)


def test_finetune_refuses_unreadable_files_in_one_line(tiny_model, tmp_path, capsys):
    good = tmp_path / "train.tsv"
    good.write_bytes(mrpc_bytes())

    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes(mrpc_bytes(2).decode("utf-8-sig").replace("Amrozi", "Amr\u00f3zi").encode("latin-1"))
    assert finetune(tiny_model, latin1, good, tmp_path / "a") == 2
    err = capsys.readouterr().err
    assert f"{latin1}:2: not UTF-8 text" in err and "iconv -f latin1 -t UTF-8" in err

    header_only = tmp_path / "dev.tsv"
    header_only.write_bytes(mrpc_bytes(0))
    assert finetune(tiny_model, good, header_only, tmp_path / "b") == 2
    assert f"{header_only}:1: holds only the header row" in capsys.readouterr().err

    stray = tmp_path / "stray.tsv"
    stray.write_bytes(mrpc_bytes(3).replace(b"witness \" ,", b"witness \"\t,", 1))
    assert finetune(tiny_model, stray, good, tmp_path / "c") == 2
    assert f"{stray}:2: 6 columns where the header has 5" in capsys.readouterr().err
