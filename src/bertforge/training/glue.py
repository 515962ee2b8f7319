"""The GLUE benchmark by name (row 5): fine-tune and evaluate every GLUE task whose files are under the data
root, print the paper's table (task, metric, dev score) and write the test-set predictions in the GLUE
leaderboard's submission format.

Each task is a named task of `families.tasks.TASKS` (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`,
`qnli`, `rte`, `wnli`) reading the official files as GLUE ships them; this module adds what only the
benchmark needs, one `GlueRow` per row of the table and per submission file:

- which training run makes its model (MNLI-m, MNLI-mm and the diagnostic set AX share the one `mnli` run:
  MNLI-m is its own dev set, dev_matched.tsv, which picks the best checkpoint; MNLI-mm scores that model on
  dev_mismatched.tsv; AX is unlabeled and only predicted),
- its test file, the column its row ids are in (`index`; QQP's `id`), and how to read it where its layout
  differs from the training file's (CoLA's test.tsv has the header `index sentence`, its train.tsv no header),
- the leaderboard's file name (`CoLA.tsv`, `SST-2.tsv`, ..., `MNLI-m.tsv`, `MNLI-mm.tsv`, `AX.tsv`).

Training and scoring go through `run_finetuning` and `evaluate`, so a GLUE run is the same as running
`bertforge finetune --task T` and `bertforge evaluate` by hand. Test predictions come from `evaluate(...,
labelled=False)`, whose records follow file order; the row ids are read from the same file by the same
reader (`read_classification`, malformed rows an error, so nothing is skipped on either side) and the two
counts must agree.

Submission format (one file per row): header `index<TAB>prediction`, one line per test row, in file order;
the prediction is the label as GLUE writes it — `0`/`1` (CoLA, SST-2, MRPC, QQP, WNLI),
`entailment`/`not_entailment` (RTE, QNLI), `entailment`/`neutral`/`contradiction` (MNLI-m, MNLI-mm, AX),
a float in [0, 5] with three decimals (STS-B; the model's value clipped to the scale).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.configuration import merge, set_dotted, shared_data_root
from bertforge.data.classification import read_classification
from bertforge.errors import ConfigError, DataError
from bertforge.evaluation.saved_model import evaluate
from bertforge.families.tasks import TASKS
from bertforge.metrics.classification import prediction_collapse
from bertforge.storage import write_json
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import load_finetune_config

log = logging.getLogger("bertforge.glue")

METRIC_NAMES = {"accuracy": "accuracy", "f1": "F1", "mcc": "MCC", "pearson": "Pearson", "spearman": "Spearman"}
# Rows left out of the average, as the BERT paper's Average leaves out WNLI (AX has no dev score).
NOT_AVERAGED = frozenset({"WNLI", "AX"})
STSB_RANGE = (0.0, 5.0)


@dataclass(frozen=True)
class GlueRow:
    """One row of the GLUE table and one submission file.

    Attributes:
        name: the paper's / leaderboard's name ("MNLI-mm"); the submission file is `<name>.tsv`.
        key: the `--tasks` name ("mnli-mm"); the leaderboard name is accepted too.
        task: the `TASKS` entry whose fine-tuning run makes the model ("mnli").
        dev: the labelled file this row is scored on, under the data root (None: no dev score, AX); when it
            is the task's own dev file, the run's best evaluation is the score.
        test: candidate paths of the unlabeled test file under the data root, the first present one is used.
        metrics: the metrics shown, in the paper's order.
        index_column: the header name of the column holding the row ids the leaderboard expects.
        test_overrides: `evaluate` overrides of the task description (reader settings) for a test file laid
            out unlike the training file.
    """

    name: str
    key: str
    task: str
    dev: str | None
    test: tuple[str, ...]
    metrics: tuple[str, ...]
    index_column: str = "index"
    test_overrides: Mapping[str, Any] = field(default_factory=dict)


def _row(name: str, key: str, folder: str, metrics: tuple[str, ...], *, task: str | None = None,
         dev: str = "dev.tsv", test: str = "test.tsv", **kwargs) -> GlueRow:
    return GlueRow(name, key, task or key, f"glue/{folder}/{dev}", (f"glue/{folder}/{test}",), metrics, **kwargs)


# In the BERT paper's column order (Table 1), then WNLI (left out of its table) and the diagnostic set.
GLUE_ROWS: tuple[GlueRow, ...] = (
    _row("MNLI-m", "mnli", "MNLI", ("accuracy",), dev="dev_matched.tsv", test="test_matched.tsv"),
    _row("MNLI-mm", "mnli-mm", "MNLI", ("accuracy",), task="mnli", dev="dev_mismatched.tsv",
         test="test_mismatched.tsv"),
    _row("QQP", "qqp", "QQP", ("f1", "accuracy"), index_column="id"),
    _row("QNLI", "qnli", "QNLI", ("accuracy",)),
    _row("SST-2", "sst2", "SST-2", ("accuracy",)),
    _row("CoLA", "cola", "CoLA", ("mcc",), test_overrides={"reader": {"text_a_column": "sentence", "header": True}}),
    _row("STS-B", "stsb", "STS-B", ("pearson", "spearman")),
    _row("MRPC", "mrpc", "MRPC", ("f1", "accuracy")),
    _row("RTE", "rte", "RTE", ("accuracy",)),
    _row("WNLI", "wnli", "WNLI", ("accuracy",)),
    # The diagnostic set: unlabeled, predicted with the MNLI model. GLUE's download script puts it in
    # glue/diagnostic/; some copies have it at glue/diagnostic.tsv.
    GlueRow("AX", "ax", "mnli", None, ("glue/diagnostic/diagnostic.tsv", "glue/diagnostic.tsv",
                                      "glue/AX/diagnostic.tsv"), ()),
)
# Run settings per task that the official files need: QQP's train.tsv has a few rows with missing columns.
TASK_VALUES: dict[str, dict[str, Any]] = {"qqp": {"data": {"on_invalid": "skip"}}}
# The `bertforge glue` settings and the FinetuneConfig key each sets.
TRAINING_KEYS = {"epochs": "training.epochs", "steps": "training.steps", "batch_size": "training.batch_size",
                 "lr": "training.lr", "warmup_ratio": "training.warmup_ratio",
                 "max_seq_length": "features.max_seq_length", "train_limit": "data.train_limit",
                 "dev_limit": "data.dev_limit", "seed": "training.seed", "device": "training.device",
                 "precision": "training.precision", "on_invalid": "data.on_invalid",
                 "eval_batch_size": "eval_batch_size"}


def _normal(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def task_config(model: str | os.PathLike, task: str, root: Path, out_dir: Path, given: Mapping[str, Any]):
    """The fine-tuning config of one GLUE task: its named task, the task's own settings (`TASK_VALUES`),
    then the run's settings (`TRAINING_KEYS` names)."""
    values = {"model": os.fspath(model), "data": {"task": task, "data_root": os.fspath(root)},
              "training": {"out_dir": os.fspath(out_dir)}}
    merge(values, copy.deepcopy(TASK_VALUES.get(task, {})))
    for key, value in given.items():
        set_dotted(values, TRAINING_KEYS[key], value)
    return load_finetune_config(values=values)


def select_rows(names: Sequence[str] | None = None) -> list[GlueRow]:
    """The rows asked for by `--tasks` names (keys like `mnli-mm` or leaderboard names like `MNLI-mm`, any
    case), in table order; every row when `names` is empty.

    Raises:
        ConfigError: an unknown name, with the valid ones.
    """
    if not names:
        return list(GLUE_ROWS)
    lookup = {_normal(spelling): row for row in GLUE_ROWS for spelling in (row.key, row.name)}
    wanted = set()
    for name in names:
        row = lookup.get(_normal(name.strip()))
        if row is None:
            raise ConfigError(f"glue: unknown task {name!r}; choose from {', '.join(r.key for r in GLUE_ROWS)} "
                              f"(or the leaderboard names {', '.join(r.name for r in GLUE_ROWS)})")
        wanted.add(row.name)
    return [row for row in GLUE_ROWS if row.name in wanted]


def find_test_file(row: GlueRow, root: Path) -> Path | None:
    """The row's test file under the data root (the first candidate present), or None."""
    for candidate in row.test:
        if (root / candidate).is_file():
            return root / candidate
    return None


def read_test_ids(path: str | os.PathLike, column: str) -> list[str]:
    """The row ids of a GLUE test file (its `index` / `id` column), in file order, read by the reader that
    `evaluate` uses (blank lines skipped the same way; a malformed row is a DataError, never skipped)."""
    return [example.text_a.strip() for example in read_classification(path, text_a=column, header=True)]


def format_prediction(row: GlueRow, record: Mapping[str, Any], labels: Sequence[str] | None) -> str:
    """One prediction as the leaderboard expects it: the label name, or STS-B's score clipped to [0, 5]."""
    if "value" in record:
        low, high = STSB_RANGE
        return f"{min(high, max(low, float(record['value']))):.3f}"
    label = str(record["label"])
    if labels is not None and label not in labels:
        raise DataError(f"{row.name}: predicted label {label!r} is not one of the leaderboard's {list(labels)}")
    return label


def write_submission(path: Path, ids: Sequence[str], predictions: Sequence[str]) -> None:
    """`index<TAB>prediction`, then one line per test row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction", *(f"{i}\t{p}" for i, p in zip(ids, predictions, strict=True))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@dataclass
class GlueRowResult:
    """A row of the table: its dev metrics (fractions), its submission file, or why it was skipped."""

    row: GlueRow
    metrics: dict[str, float] = field(default_factory=dict)
    submission: Path | None = None
    test_rows: int = 0
    model_dir: Path | None = None
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def collapsed(self) -> bool:
        """Whether the best model predicted one class for every (or, against balanced labels, nearly every) dev
        or test example (said in `notes`): a submission of such a row scores about the majority class, however
        plausible its dev figure looks."""
        return any("collapsed" in note for note in self.notes)

    def score(self) -> float | None:
        """The row's one number: the mean of its shown metrics (None without a dev score)."""
        values = [self.metrics[m] for m in self.row.metrics if m in self.metrics]
        return sum(values) / len(values) if values and len(values) == len(self.row.metrics) else None

    def cells(self) -> tuple[str, str, str, str]:
        metric = "/".join(METRIC_NAMES.get(m, m) for m in self.row.metrics) or "-"
        if self.skipped:
            return self.row.name, metric, "-", f"skipped: {self.skipped}"
        dev = "/".join(f"{100 * self.metrics[m]:.1f}" for m in self.row.metrics if m in self.metrics) or "-"
        test = f"{self.submission.name} ({self.test_rows} rows)" if self.submission else "no test file"
        if self.collapsed:
            test = f"{test}  COLLAPSED to one class: do not submit (see the notes in glue_results.json)"
        return self.row.name, metric, dev, test


@dataclass
class GlueResult:
    """A GLUE run: one result per row, in table order, and where the submission files are."""

    rows: list[GlueRowResult]
    out_dir: Path
    submission_dir: Path
    data_root: Path

    def average(self) -> tuple[float | None, int]:
        """Mean of the rows' scores (two-metric rows count their mean), WNLI and AX left out; and how many."""
        scores = [r.score() for r in self.rows if r.row.name not in NOT_AVERAGED and not r.skipped]
        scores = [s for s in scores if s is not None]
        return (sum(scores) / len(scores) if scores else None), len(scores)

    def table(self) -> str:
        """The paper's layout, one row per task: task, metric, dev score (x100), and the submission file."""
        header = ("task", "metric", "dev", "test submission")
        lines = [header, *(r.cells() for r in self.rows)]
        average, count = self.average()
        if average is not None:
            lines.append(("average", f"{count} task{'s' if count != 1 else ''}", f"{100 * average:.1f}", "(WNLI and AX not averaged)"))
        widths = [max(len(line[i]) for line in lines) for i in range(3)]
        text = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d}".rstrip() for a, b, c, d in lines]
        submitted = sum(1 for r in self.rows if r.submission)
        text.append(f"submission: {submitted} files in {self.submission_dir}")
        return "\n".join(text)

    def to_dict(self) -> dict[str, Any]:
        average, count = self.average()
        return {"data_root": os.fspath(self.data_root), "submission_dir": os.fspath(self.submission_dir),
                "average": average, "averaged_tasks": count,
                "rows": [{"task": r.row.name, "key": r.row.key, "metrics": r.metrics, "shown": list(r.row.metrics),
                          "submission": os.fspath(r.submission) if r.submission else None, "test_rows": r.test_rows,
                          "model_dir": os.fspath(r.model_dir) if r.model_dir else None, "skipped": r.skipped,
                          "collapsed": r.collapsed, "notes": r.notes} for r in self.rows]}


def _missing(root: Path, paths: Sequence[str]) -> str | None:
    absent = [p for p in paths if not (root / p).is_file()]
    return f"{', '.join(absent)} not found under {root}" if absent else None


def submit(result: GlueRowResult, root: Path, eval_dir: Path, submission_dir: Path,
           evaluation: Mapping[str, Any]) -> None:
    """Predict the row's test file with its best model and write its submission file (a model that predicts
    one class for every test row is noted: such a file scores the majority class)."""
    row, spec = result.row, TASKS[result.row.task]
    path = find_test_file(row, root)
    if path is None:
        result.notes.append(f"{' or '.join(row.test)} not found under {root}: no submission file")
        log.warning("%s: no test file (%s) under %s", row.name, " or ".join(row.test), root)
        return
    predicted = evaluate(result.model_dir, path, out_dir=eval_dir, labelled=False,
                         overrides=dict(row.test_overrides) or None, **evaluation)
    ids = read_test_ids(path, row.index_column)
    if len(ids) != len(predicted.predictions):
        raise DataError(f"{row.name}: {len(predicted.predictions)} predictions for {len(ids)} rows", path)
    labels = None if spec.regression else (spec.labels or None)
    lines = [format_prediction(row, record, labels) for record in predicted.predictions]
    collapse = None if spec.regression else prediction_collapse(lines)
    if collapse:
        result.notes.append(f"test submission: {collapse}")
        log.warning("%s: test submission: %s", row.name, collapse)
    result.submission = submission_dir / f"{row.name}.tsv"
    result.test_rows = len(ids)
    write_submission(result.submission, ids, lines)


def run_glue(model: str | os.PathLike, *, data_root: str | os.PathLike | None = None,
             out_dir: str | os.PathLike = "runs/glue", tasks: Sequence[str] | None = None,
             settings: Mapping[str, Any] | None = None) -> GlueResult:
    """Fine-tune `model` on every selected GLUE task whose files are present, score each row on its dev
    file and write the leaderboard's submission files.

    Args:
        model: the model directory every task starts from.
        data_root: holds glue/<TASK>/ (default: $BERTFORGE_DATA, else ../shared/data).
        out_dir: one run directory per task (`<out_dir>/<task>/`: best/, eval_results.json, ...), the
            submission files in `<out_dir>/submission/`, the table in `glue_table.txt`, everything in
            `glue_results.json`.
        tasks: `--tasks` names (default: all); a task whose files are absent is skipped, saying so.
        settings: settings for every run, by the names of `TRAINING_KEYS` (epochs, lr, train_limit, ...).

    Raises:
        ConfigError: an unknown task name or setting. DataError: unreadable data. CheckpointError: bad model.
    """
    root = Path(data_root) if data_root is not None else shared_data_root()
    out = Path(out_dir)
    submission_dir = out / "submission"
    given = {k: v for k, v in (settings or {}).items() if v is not None}
    unknown = sorted(set(given) - set(TRAINING_KEYS))
    if unknown:
        raise ConfigError(f"glue: unknown settings {unknown}; use {', '.join(TRAINING_KEYS)}")
    rows = select_rows(tasks)
    results = {row.name: GlueRowResult(row) for row in rows}
    for task in dict.fromkeys(row.task for row in rows):
        task_rows = [row for row in rows if row.task == task]
        spec = TASKS[task]
        absent = _missing(root, [source.path for source in (*spec.train, *spec.dev)])
        if absent:
            for row in task_rows:
                results[row.name].skipped = absent if row.task == row.key else f"needs the {task} model: {absent}"
                log.warning("skipping %s: %s", row.name, results[row.name].skipped)
            continue
        config = task_config(model, task, root, out / task, given)
        log.info("GLUE %s: fine-tuning %s", task, ", ".join(r.name for r in task_rows))
        run = run_finetuning(config)
        best = Path(run.model_dir)
        evaluation = {"batch_size": config.eval_batch_size, "device": config.training.device}
        counts = run.data_report.get("counts", {})
        skipped = [f"{split}: {counts[key]} rows skipped ({reason.removeprefix('skipped_')})"
                   for key in sorted(counts) for split, _, reason in [key.partition(".")] if ".skipped_" in key]
        # The best evaluation's warnings (a collapse among them) belong in the table, not only in the log.
        best_warnings = [w.partition(": ")[2] for w in run.warnings if w.startswith(f"step {run.best_step}: ")]
        for row in task_rows:
            result = results[row.name]
            result.model_dir = best
            result.notes.extend(f"{note} (on_invalid={config.data.on_invalid})" for note in skipped)
            if row.dev == spec.dev[0].path:
                result.notes.extend(f"dev: {warning}" for warning in best_warnings)
            if row.dev is not None and row.dev == spec.dev[0].path:
                result.metrics = dict(run.best_metrics)
            elif row.dev is not None:
                if (root / row.dev).is_file():
                    scored = evaluate(best, root / row.dev, out_dir=out / task / f"eval-{row.name}",
                                      limit=config.data.dev_limit, **evaluation)
                    result.metrics = dict(scored.metrics)
                else:
                    result.notes.append(f"{row.dev} not found under {root}: no dev score")
            submit(result, root, out / task / f"test-{row.name}", submission_dir, evaluation)
    glue = GlueResult([results[row.name] for row in rows], out, submission_dir, root)
    out.mkdir(parents=True, exist_ok=True)
    (out / "glue_table.txt").write_text(glue.table() + "\n", encoding="utf-8")
    write_json(out / "glue_results.json", glue.to_dict())
    return glue


__all__ = ["GLUE_ROWS", "TASK_VALUES", "GlueResult", "GlueRow", "GlueRowResult", "find_test_file",
           "format_prediction", "read_test_ids", "run_glue", "select_rows", "write_submission"]
