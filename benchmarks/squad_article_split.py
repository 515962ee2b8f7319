"""One part of the `squad` task's article split as its own SQuAD JSON file, for `bertforge evaluate --data`.

SQuAD v1.1's train file is not available here, so the named task `squad` trains on 36 of the 48 articles of
dev-v1.1.json and evaluates on the other 12 (`data.question_answering.article_split`: articles 3, 7, 11, ...;
whole articles, so no paragraph is on both sides). `bertforge finetune --task squad` applies that split
itself; `bertforge evaluate` scores a whole file. This writes the held-apart articles (`--part eval`, or the
training ones with `--part train`) unchanged, in file order, so `evaluate` scores exactly the task's eval
split at any precision; `--articles N` keeps the part's first N articles (a shorter run, still whole articles).

    python -m benchmarks.squad_article_split --data ../shared/data/squad_v1.1/dev-v1.1.json \
        --out runs/squad/dev-eval-articles.json
"""

from __future__ import annotations

import argparse
import json
import os

from bertforge.data.question_answering import article_split, count_articles
from bertforge.families.question_answering import EVAL_EVERY
from bertforge.storage import write_json


def split_part(path: str | os.PathLike, part: str, articles: int | None = None) -> dict:
    """The SQuAD file's JSON with only the articles of `part` ("train" or "eval") of the task's split (only
    the first `articles` of them, if given)."""
    if part not in ("train", "eval"):
        raise ValueError(f"part must be 'train' or 'eval', got {part!r}")
    if articles is not None and articles < 1:
        raise ValueError(f"articles must be at least 1, got {articles}")
    train_ids, eval_ids = article_split(count_articles(path), EVAL_EVERY)
    keep = set((eval_ids if part == "eval" else train_ids)[:articles])
    with open(path, encoding="utf-8") as handle:
        dataset = json.load(handle)
    return {**dataset, "data": [article for index, article in enumerate(dataset["data"]) if index in keep]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a SQuAD-format JSON file (dev-v1.1.json)")
    parser.add_argument("--part", default="eval", choices=("train", "eval"))
    parser.add_argument("--articles", type=int, help="keep only the part's first N articles")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    dataset = split_part(args.data, args.part, args.articles)
    write_json(args.out, dataset)
    questions = sum(len(p["qas"]) for article in dataset["data"] for p in article["paragraphs"])
    print(f"{args.out}: {len(dataset['data'])} articles ({args.part} part), {questions} questions")


if __name__ == "__main__":
    main()
