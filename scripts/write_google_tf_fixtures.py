"""Write the Google-format TensorFlow 1 BERT fixtures of tests/fixtures/google_tf/ with real TensorFlow.

Not part of the package and not run by the tests: run it in a throwaway virtualenv outside the repository,

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu numpy
    /tmp/tfvenv/bin/python scripts/write_google_tf_fixtures.py

Written with TensorFlow 2.21.0 (tensorflow-cpu wheel, Python 3.11, numpy 2.x), graph mode through
`tf.compat.v1` and `tf.compat.v1.train.Saver` exactly as Google's run_pretraining.py saves checkpoints.

It builds a tiny random BERT (vocab 99, hidden 32, 2 layers, 4 heads, intermediate 37, 64 positions) as
variables under Google's names and saves

- `uncased_L-2_H-32_A-4/`: the release layout (`bert_config.json`, `vocab.txt`, `bert_model.ckpt.index` +
  `.data-00000-of-00001`; no optimizer state), holding the weights of step 20;
- `pretraining_output/`: the layout run_pretraining.py leaves (`model.ckpt-10.*`, `model.ckpt-20.*`, the
  `checkpoint` text file naming step 20), with `adam_m` / `adam_v` for every variable and `global_step`;
  `bert_config.json` is copied in, as a user must (run_pretraining.py takes it as --bert_config_file);
  the `.meta` graph files are not written (nothing reads them; they would triple the size);
- `dtypes/dtypes.ckpt.*`: one variable per dtype (float32/64, float16, bfloat16, int8/16/32/64, uint8,
  bool, string, complex64, an empty tensor) for the reader's dtype table;
- `expected.npz`: every variable stored above (model variables of both steps, the dtype variables;
  bfloat16 values are bfloat16-representable and stored as float32), for bitwise comparison.

Values are random normals rounded to multiples of 2**-10 (so expected.npz compresses well); every value
is still an ordinary float32 with no structure the reader could rely on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "google_tf"
CONFIG = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 99,
}
WORDS = ("the of and to in is was he for it with as his on be at by i this had not are but from or have an "
         "they which one you were her all she there would their we him been has when who will more no if "
         "out so said what up its about into than them can only other new some could time these two may "
         "then do first any my now such like our over man me even most made after also did many before "
         "##s ##ed ##ing ##ly").split()


def vocabulary() -> list[str]:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tokens += [f"[unused{i}]" for i in range(CONFIG["vocab_size"] - len(tokens))]
    assert len(tokens) == CONFIG["vocab_size"] and len(set(tokens)) == len(tokens)
    return tokens


def shapes() -> dict[str, tuple[int, ...]]:
    """Google's variable names and shapes (kernels [in, out], NSP output_weights [2, H])."""
    v, h, i, p, t = (CONFIG[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                         "max_position_embeddings", "type_vocab_size"))
    out = {"bert/embeddings/word_embeddings": (v, h), "bert/embeddings/token_type_embeddings": (t, h),
           "bert/embeddings/position_embeddings": (p, h),
           "bert/embeddings/LayerNorm/beta": (h,), "bert/embeddings/LayerNorm/gamma": (h,)}
    for n in range(CONFIG["num_hidden_layers"]):
        layer = f"bert/encoder/layer_{n}"
        for name in ("query", "key", "value"):
            out[f"{layer}/attention/self/{name}/kernel"] = (h, h)
            out[f"{layer}/attention/self/{name}/bias"] = (h,)
        out[f"{layer}/attention/output/dense/kernel"] = (h, h)
        out[f"{layer}/attention/output/dense/bias"] = (h,)
        out[f"{layer}/attention/output/LayerNorm/beta"] = (h,)
        out[f"{layer}/attention/output/LayerNorm/gamma"] = (h,)
        out[f"{layer}/intermediate/dense/kernel"] = (h, i)
        out[f"{layer}/intermediate/dense/bias"] = (i,)
        out[f"{layer}/output/dense/kernel"] = (i, h)
        out[f"{layer}/output/dense/bias"] = (h,)
        out[f"{layer}/output/LayerNorm/beta"] = (h,)
        out[f"{layer}/output/LayerNorm/gamma"] = (h,)
    out.update({
        "bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,),
        "cls/predictions/transform/dense/kernel": (h, h), "cls/predictions/transform/dense/bias": (h,),
        "cls/predictions/transform/LayerNorm/beta": (h,), "cls/predictions/transform/LayerNorm/gamma": (h,),
        "cls/predictions/output_bias": (v,),
        "cls/seq_relationship/output_weights": (2, h), "cls/seq_relationship/output_bias": (2,),
    })
    return out


def values(rng: np.random.Generator, shape: tuple[int, ...], name: str, scale: float = 0.2) -> np.ndarray:
    x = rng.normal(0.0, scale, size=shape)
    if name.endswith("gamma"):
        x = 1.0 + x
    return (np.round(x * 1024) / 1024).astype(np.float32)


def save(variables: dict[str, np.ndarray], prefix: Path, step: int | None = None) -> None:
    """Save numpy values as tf.compat.v1 variables named as the keys, in a fresh graph."""
    graph = tf.Graph()
    with graph.as_default():
        made = []
        for name, value in variables.items():
            made.append(tf.compat.v1.get_variable(name, initializer=tf.constant(value), trainable=False))
        saver = tf.compat.v1.train.Saver(made, save_relative_paths=True, max_to_keep=None)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(prefix), global_step=step, write_meta_graph=False)


def main() -> None:
    if ROOT.exists():
        shutil.rmtree(ROOT)
    ROOT.mkdir(parents=True)
    rng = np.random.default_rng(13)
    expected: dict[str, np.ndarray] = {}
    vocab = "".join(t + "\n" for t in vocabulary())

    # run_pretraining.py layout: two steps saved by one Saver (so the `checkpoint` file lists both), Adam
    # slots under AdamWeightDecayOptimizer's names, global_step.
    run = ROOT / "pretraining_output"
    run.mkdir()
    steps = {}
    for step in (10, 20):
        model = {name: values(rng, shape, name) for name, shape in shapes().items()}
        state = dict(model)
        for name, shape in shapes().items():
            state[f"{name}/adam_m"] = values(rng, shape, "m", 0.01)
            state[f"{name}/adam_v"] = np.abs(values(rng, shape, "v", 0.01))
        state["global_step"] = np.array(step, dtype=np.int64)
        steps[step] = state
        expected.update({f"step{step}/{k}": v for k, v in model.items()})
    graph = tf.Graph()
    with graph.as_default():
        made = {name: tf.compat.v1.get_variable(name, initializer=tf.constant(value), trainable=False)
                for name, value in steps[10].items()}
        feeds = {name: tf.compat.v1.placeholder(var.dtype.base_dtype, var.shape) for name, var in made.items()}
        assign = tf.group(*(made[name].assign(feeds[name]) for name in made))
        saver = tf.compat.v1.train.Saver(list(made.values()), save_relative_paths=True, max_to_keep=5)
        with tf.compat.v1.Session(graph=graph) as session:
            for step, state in steps.items():
                session.run(assign, {feeds[name]: value for name, value in state.items()})
                saver.save(session, str(run / "model.ckpt"), global_step=step, write_meta_graph=False)
    final = {name: value for name, value in steps[20].items() if name in shapes()}
    (run / "bert_config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")

    # Release layout: Google shipped the final weights without optimizer state.
    release = ROOT / "uncased_L-2_H-32_A-4"
    release.mkdir()
    save(final, release / "bert_model.ckpt")
    (release / "checkpoint").unlink()  # the Saver's bookkeeping; Google's release archives have none
    (release / "bert_config.json").write_text(json.dumps(CONFIG, indent=2, sort_keys=True) + "\n")
    (release / "vocab.txt").write_text(vocab, encoding="utf-8")

    # One variable per dtype for the reader's dtype table.
    kinds = {
        "float32": np.array([[1.5, -2.25, 3.0], [0.0, -0.0, 1e-30]], np.float32),
        "float64": np.array([np.pi, -1e300], np.float64),
        "float16": np.array([0.5, -65504.0, 1e-4], np.float16),
        "bfloat16": np.array([1.0, -3.140625, 2.0 ** -100, 65280.0], np.float32),
        "int8": np.array([-128, 127], np.int8),
        "int16": np.array([-32768, 7], np.int16),
        "int32": np.array([[1, -2], [2 ** 31 - 1, -(2 ** 31)]], np.int32),
        "int64": np.array([2 ** 62, -5], np.int64),
        "uint8": np.array([0, 255, 7], np.uint8),
        "bool": np.array([True, False, True]),
        "empty": np.zeros((0, 3), np.float32),
    }
    folder = ROOT / "dtypes"
    folder.mkdir()
    graph = tf.Graph()
    with graph.as_default():
        made = []
        for name, value in kinds.items():
            tensor = tf.constant(value)
            if name == "bfloat16":
                tensor = tf.cast(tensor, tf.bfloat16)
            made.append(tf.compat.v1.get_variable(f"dtypes/{name}", initializer=tensor, trainable=False))
        made.append(tf.compat.v1.get_variable("dtypes/string", initializer=tf.constant([b"bert", b"", b"x" * 200]),
                                              trainable=False))
        made.append(tf.compat.v1.get_variable("dtypes/complex64", initializer=tf.constant([1 + 2j], tf.complex64),
                                              trainable=False))
        saver = tf.compat.v1.train.Saver(made, save_relative_paths=True)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(folder / "dtypes.ckpt"), write_meta_graph=False)
    expected.update({f"dtypes/{k}": v for k, v in kinds.items()})

    np.savez_compressed(ROOT / "expected.npz", **expected)
    (ROOT / "README.md").write_text(
        "# Google-format TensorFlow 1 BERT checkpoints (test fixtures)\n\n"
        f"Written by `scripts/write_google_tf_fixtures.py` with TensorFlow {tf.__version__} "
        f"(numpy {np.__version__})\nthrough `tf.compat.v1.train.Saver`; see the script's docstring for how "
        "to rerun it. bertforge reads them\nwith numpy and the standard library only "
        "(`bertforge.interop.google_tf`).\n\n"
        "- `uncased_L-2_H-32_A-4/`: a release directory as Google ships one (bert_config.json, vocab.txt,\n"
        "  bert_model.ckpt.index + .data-00000-of-00001), tiny random weights (vocab 99, hidden 32, 2 layers,\n"
        "  4 heads, intermediate 37, 64 positions).\n"
        "- `pretraining_output/`: what run_pretraining.py leaves: model.ckpt-10.* and model.ckpt-20.*, the\n"
        "  `checkpoint` file naming step 20, adam_m/adam_v for every variable and global_step. The .meta\n"
        "  graphs are not written; bert_config.json is copied in as a user would.\n"
        "- `dtypes/`: one variable per dtype, including a string and an unsupported complex64 tensor.\n"
        "- `expected.npz`: every stored variable (`step10/<name>`, `step20/<name>`, `dtypes/<name>`), for bitwise\n"
        "  comparison. The release directory holds the step-20 weights.\n")
    total = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    print(f"TensorFlow {tf.__version__}: wrote {ROOT} ({total} bytes)")


if __name__ == "__main__":
    main()
