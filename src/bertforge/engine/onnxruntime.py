"""`OrtEngine`: a model run by ONNX Runtime, through the exported and optimized graph (fp32, or int8).

The engine is model-shaped like every engine: a family's forward calls it with `input_ids`, `token_type_ids` and
`attention_mask` and reads the fields the PyTorch model returns (`logits`, `start_logits`/`end_logits`,
`last_hidden_state`/`pooled_output`), so features, batching and decoding are the families' own, shared with the
PyTorch engine. `engine.bert` is the encoder's graph (what the embedding family runs on any model). Output fields
that do not depend on the input (a CRF's transition scores: `constant_outputs`) come from the PyTorch model. A
family whose forward asks the model for more than its exported outputs (fill-mask's masked positions, sparse
vectors' pooling over the MLM logits: `Family.runs_as_graph` False) runs its model's heads in PyTorch on the
encoder's graph (`on_encoder_graph`): the model with its encoder replaced by the encoder's graph, so the heads
are the model's own code and the graph gives only the hidden states. The [B, T, V] logits of an MLM head
would be the largest tensor a graph could give (128 MiB for 32 texts of 32 tokens); the heads reduce them
where they are made. At int8 this is what the PyTorch engine's int8 does too: only the encoder's linears are
quantized, the heads run in float32.

The graph is `bertforge export --optimize [--quantize int8]`'s: our export of the plain path
(`onnx_export.trace_module`), fused by ONNX Runtime's BERT optimizer (`onnx_graph.fuse`: Attention,
EmbedLayerNormalization, SkipLayerNormalization, BiasGelu) and held to PyTorch within 1e-4 before it is used,
then for int8 quantized by ONNX Runtime's dynamic quantizer with per-channel weight scales
(`onnx_graph.quantize_int8`). It is made once per model and settings and kept in the user's cache,
`storage.user_cache("onnx", <key>)` (`$BERTFORGE_CACHE`, else `$XDG_CACHE_HOME/bertforge`, else
`~/.cache/bertforge`), never in the model's own folder (an installed package's, a read-only mount, a folder
under version control); the key is the sha256 of the weights' checksum, the model's config and the export
settings (`graph_key`), so a later run with the same weights and settings loads it without exporting, from
whatever folder the model was read. The folder is written whole or not at all (`storage.atomic_directory`),
and its `engine.json` records what it was exported from (the key's inputs) and each graph file's sha256 and
size; a load verifies both (`cached_record`) and exports again, with one log line saying why, when the folder
has no record, another model's record, or a graph file that is not the one exported (another model's copied
in, a truncated or damaged file). The session runs on the CPU with the plan's intra-op thread count and one
inter-op thread, both reported by `describe` (`/health`), and its pool's threads sleep rather than spin when a
run ends (`ALLOW_SPINNING`: `engine.threads`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import storage
from bertforge.checkpoint_integrity import brief
from bertforge.engine.engine import Engine
from bertforge.engine.onnx_export import (
    DEFAULT_OPSET,
    FP32_TOLERANCE,
    check_parity,
    max_differences,
    output_axes,
    trace_module,
)
from bertforge.engine.plan import EnginePlan
from bertforge.errors import ConfigError
from bertforge.families import registry
from bertforge.model.fast_paths import is_encoder, set_fast_paths

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # part of every key: a change of how graphs are made or recorded makes new ones
GRAPH_FILES = {"fp32": "model.optimized.onnx", "int8": "model.int8.onnx"}
RECORD_NAME = "engine.json"
# The graph is one chain of operators: a second inter-op thread would only spin beside the intra-op pool.
INTER_OP_THREADS = 1
# "0": the intra-op pool's threads sleep when idle instead of spinning (ONNX Runtime's default is to spin), which
# burns CPU time a neighbour (or our own tokenizer and PyTorch heads) needs (engine.threads).
ALLOW_SPINNING = "0"


def onnxruntime_module():
    """The onnxruntime package (ConfigError naming the extra when it is missing)."""
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError("--engine onnxruntime needs the 'export' extra (onnx, onnxruntime): "
                          "pip install 'bertforge[export]'") from None
    return onnxruntime


def weights_checksum(module: nn.Module) -> str:
    """sha256 of the module's saved tensors (names, shapes, dtypes and bytes, in name order): the weights as
    they run, whether or not they came from a file."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def graph_key(module: nn.Module, precision: str, outputs: list[str]) -> tuple[str, dict[str, Any]]:
    """(key, what it hashes): the weights' checksum, the model's config (heads, activation, epsilon: what
    the graph computes beyond the weights) and the export settings."""
    config = getattr(module, "config", None)
    settings = {"version": CACHE_VERSION, "weights": weights_checksum(module), "class": type(module).__name__,
                "config": config.to_dict() if hasattr(config, "to_dict") else None,
                "outputs": outputs, "precision": precision, "opset": DEFAULT_OPSET,
                "onnxruntime": onnxruntime_module().__version__, "torch": torch.__version__.split("+")[0]}
    settings = json.loads(json.dumps(settings, sort_keys=True))  # as engine.json reads it back
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:32], settings


def cache_root() -> Path:
    """Where graphs are kept: the user's cache (module docstring), one folder per key."""
    return storage.user_cache("onnx")


def cached_record(folder: Path, settings: dict[str, Any], precision: str) -> tuple[dict[str, Any] | None, str | None]:
    """(engine.json's record, None) when `folder` holds the graph exported for `settings` intact; (None, why
    not) when it holds something else; (None, None) when there is no folder. The graph file is compared with
    the sha256 and size its record keeps (the size first: a truncated file costs no hash)."""
    if not folder.exists():
        return None, None
    try:
        record = storage.read_json(folder / RECORD_NAME, what="engine record")
    except FileNotFoundError:
        return None, f"no {RECORD_NAME} (an export that did not finish, or a folder from elsewhere)"
    except ValueError as error:
        return None, str(error)
    key = record.get("key") if isinstance(record, dict) else None
    if key != settings:
        differ = sorted(name for name in settings if not isinstance(key, dict) or key.get(name) != settings[name])
        return None, f"{RECORD_NAME} records a graph of another model or settings (differs in {', '.join(differ)})"
    name = GRAPH_FILES[precision]
    files = record.get("files")
    entry = files.get(name) if isinstance(files, dict) else None
    if not isinstance(entry, dict):
        return None, f"{RECORD_NAME} records no checksum of {name}"
    problem = storage.file_differs(folder / name, entry, RECORD_NAME)
    if problem is not None:
        return None, f"{name}: {problem}"
    return record, None


@dataclass
class Graph:
    """One exported graph in its session: file, output names, whether it was exported now or reused, and the
    export's record (fused operator counts, parity with PyTorch)."""

    path: Path
    outputs: list[str]
    inputs: list[str]
    session: Any
    cache: str
    record: dict[str, Any]
    constants: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        sha256 = self.record.get("files", {}).get(self.path.name, {}).get("sha256")
        return {"file": str(self.path), "sha256": sha256, "cache": self.cache, "outputs": self.outputs,
                "fused": self.record.get("fused", {}), "max_abs_diff_fp32": self.record.get("max_abs_diff", {})}


def export_graph(module: nn.Module, family: Any, folder: Path, precision: str) -> dict[str, Any]:
    """Export `module` on the plain path, fuse it, hold it to PyTorch, quantize it for int8, into `folder`; the
    record of what was made."""
    from bertforge.engine.onnx_graph import fuse, quantize_int8  # onnx and onnxruntime: the export extra

    # The first run of a model on this engine pays for the export (seconds to a minute); say so before it starts.
    log.info("onnxruntime engine: exporting %s to an ONNX graph and checking it against PyTorch (once per model "
             "and settings; later runs reuse it)", type(module).__name__)
    plain_model = set_fast_paths(copy.deepcopy(module), unpad=False, fused_qkv=False).float().eval()
    plain = folder / "model.onnx"
    reference = trace_module(plain_model, family, plain)
    config = plain_model.config
    optimized = folder / GRAPH_FILES["fp32"]
    fused = fuse(plain, optimized, config.num_attention_heads, config.hidden_size)
    plain.unlink()  # the optimized graph holds every weight again
    session = onnxruntime_module().InferenceSession(str(optimized), providers=["CPUExecutionProvider"])
    differences = max_differences(reference, family, session)
    check_parity(optimized, differences, FP32_TOLERANCE)
    if precision == "int8":
        quantize_int8(optimized, folder / GRAPH_FILES["int8"])
    return {"outputs": list(reference.names), "fused": fused, "max_abs_diff": differences}


class OrtEngine(Engine):
    """ONNX Runtime running the model's exported graph (module docstring), on the CPU, at fp32 or int8."""

    kind = "onnxruntime"
    devices = ("cpu",)
    precisions = ("fp32", "int8")

    @classmethod
    def build(cls, model: nn.Module, plan: EnginePlan, source: str | os.PathLike | None = None) -> OrtEngine:
        onnxruntime_module()
        return cls(model.to(plan.device).eval(), plan, source)

    def __init__(self, model: nn.Module, plan: EnginePlan, source: str | os.PathLike | None = None):
        converters = ["onnx_export", "ort_optimizer"] + (["ort_int8"] if plan.precision == "int8" else [])
        super().__init__(model, plan, converters)
        # Plain attributes (not submodules): the graph, its lock, the encoder's own engine, and the model with
        # its encoder replaced by that engine (`on_encoder_graph`).
        self.__dict__.update(source=source, graph=None, lock=threading.Lock(), encoder_engine=None, headed=None,
                             heads=set())

    # --- the graph -------------------------------------------------------------------------------------
    def prepare(self, family: Any) -> None:
        """Export (or load) the graph `family` reads now, not at the first request: the model's own graph when
        the family reads nothing but its exported outputs, else the encoder's, under the model's heads."""
        if family.runs_as_graph and isinstance(self.model, family.model_class):
            self.session_graph()
            return
        if not family.runs_as_graph:
            self.heads.add(family.name)
            if self.plan.threads is not None and self.plan.threads != torch.get_num_threads():
                torch.set_num_threads(self.plan.threads)  # the heads run in PyTorch: at the plan's threads too
        self.bert.session_graph()

    @property
    def on_encoder_graph(self) -> nn.Module:
        """The wrapped model with its encoder (`model.bert`) replaced by the encoder's graph (`bert`): its heads
        run in PyTorch on the graph's hidden states (a bare encoder: this engine itself)."""
        if is_encoder(self.model):
            return self
        if self.headed is None:
            headed = copy.copy(self.model)  # shares parameters, buffers and config with the model
            headed.__dict__["_modules"] = {**self.model._modules, "bert": self.bert}
            self.__dict__["headed"] = headed
        return self.headed

    def __getattr__(self, name: str) -> Any:
        """The wrapped model's attributes, its methods bound to `on_encoder_graph` (`sparse_rows` runs the
        encoder's graph, then the MLM head in PyTorch)."""
        try:
            return nn.Module.__getattr__(self, name)  # the engine's own parameters, buffers and modules
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None:
                raise
        return getattr(model if is_encoder(model) else self.on_encoder_graph, name)

    def session_graph(self) -> Graph:
        """The wrapped model's graph in its session: loaded from the cache, else exported into it first."""
        if self.graph is not None:
            return self.graph
        with self.lock:
            if self.graph is None:
                self.__dict__["graph"] = self.load_graph()
        return self.graph

    def load_graph(self) -> Graph:
        """The graph from the cache when it holds this model's intact (`cached_record`), else exported now."""
        family = registry.for_model(self.model)
        precision = self.plan.precision
        names = list(output_axes(self.model, family))
        key, settings = graph_key(self.model, precision, names)
        folder = cache_root() / key
        record, problem = cached_record(folder, settings, precision)
        cache = "reused"
        if record is None:
            if problem is not None:
                log.warning("%s: %s; exporting the graph of %s again", folder, problem, self.source or "the model")
            record = self.export_into(folder, family, precision, settings)
            cache = "exported"
        path = folder / GRAPH_FILES[precision]
        session = self.session_of(path, f"delete {folder} (it is exported again at the next start)")
        return Graph(path, record["outputs"], [i.name for i in session.get_inputs()], session, cache, record,
                     self.constant_outputs())

    def export_into(self, folder: Path, family: Any, precision: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Export the graph into `folder` whole or not at all (built aside, then one rename replacing whatever
        was there: a killed export leaves a temporary name, never a key folder); its record, with each file's
        checksum."""
        try:
            with storage.atomic_directory(folder) as work:
                record = {**export_graph(self.model, family, work, precision), "key": settings}
                record["files"] = {path.name: storage.file_record(path) for path in sorted(work.iterdir())}
                storage.write_json(work / RECORD_NAME, record)
        except OSError as error:
            raise ConfigError(f"{folder}: the exported graph cannot be written there ({error}); set "
                              f"{storage.CACHE_ENV} to a folder you can write, or use --engine torch") from None
        return record

    def constant_outputs(self) -> dict[str, Any]:
        """The wrapped model's output fields that do not depend on the input, computed once."""
        constant = getattr(self.model, "constant_outputs", None)
        with torch.inference_mode():
            return constant() if constant is not None else {}

    def session_of(self, path: Path, fix: str) -> Any:
        """An ONNX Runtime CPU session on `path` with the plan's intra-op threads, `INTER_OP_THREADS` and
        `ALLOW_SPINNING`; a file ONNX Runtime cannot load is one ConfigError naming it and `fix`."""
        ort = onnxruntime_module()
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.plan.threads or 1
        options.inter_op_num_threads = INTER_OP_THREADS
        options.add_session_config_entry("session.intra_op.allow_spinning", ALLOW_SPINNING)
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's own classes (InvalidProtobuf, Fail, NoSuchFile) are not ours
            raise ConfigError(f"{path}: ONNX Runtime cannot load this graph ({brief(error)}); {fix}") from None

    def on_graph(self, path: str | os.PathLike) -> OrtEngine:
        """This engine's model and plan running another graph file with the same inputs and outputs as its own
        (another quantization of its fp32 graph, say: what benchmarks/ort_int8_accuracy.py compares), taken as
        it is: neither cached nor checked against PyTorch."""
        graph = self.session_graph()
        engine = OrtEngine(self.model, self.plan, self.source)
        session = engine.session_of(Path(path), "give a complete graph file exported from this model")
        engine.__dict__["graph"] = Graph(Path(path), graph.outputs, [i.name for i in session.get_inputs()], session,
                                         "given", {}, graph.constants)
        return engine

    # --- model-shaped ----------------------------------------------------------------------------------
    @property
    def bert(self) -> OrtEngine:
        """The encoder's graph, as an engine of its own (the engine itself for a bare encoder)."""
        if is_encoder(self.model):
            return self
        if self.encoder_engine is None:
            self.__dict__["encoder_engine"] = OrtEngine(self.model.bert, self.plan, self.source)
        return self.encoder_engine

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, **asked: Any) -> GraphOutput:
        # The graph is the padded path traced: every position is computed, masked ones too (`compute_masked`).
        more = sorted(name for name, value in asked.items()
                      if value is not None and value is not False and name != "compute_masked")
        if more:
            if is_encoder(self.model) and self.plan.auto:  # not asked for by name: PyTorch takes it
                return self.model(input_ids, token_type_ids, attention_mask, **asked)
            if is_encoder(self.model):
                raise ConfigError(f"the onnxruntime engine runs the exported encoder, which takes input_ids, "
                                  f"token_type_ids and attention_mask only; {', '.join(more)} need --engine torch")
            # fill-mask's masked positions and the like: the model's heads, on the encoder's graph
            return self.on_encoder_graph(input_ids, token_type_ids, attention_mask, **asked)
        graph = self.graph or self.session_graph()
        given = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        feeds = {}
        for name in graph.inputs:
            value = given.get(name)
            if value is None:
                value = torch.ones_like(input_ids) if name == "attention_mask" else torch.zeros_like(input_ids)
            # A CPU int64 tensor shares its memory with the array (the usual case: no copy).
            feeds[name] = value.detach().to("cpu", torch.int64).numpy()
        values = graph.session.run(graph.outputs, feeds)
        return GraphOutput(zip(graph.outputs, map(torch.from_numpy, values)), **graph.constants)

    def describe(self) -> dict[str, Any]:
        graphs = {role: engine.graph.describe()
                  for role, engine in (("model", self), ("encoder", self.encoder_engine))
                  if engine is not None and engine.graph is not None}
        return {**super().describe(), "onnxruntime": onnxruntime_module().__version__,
                "intra_op_threads": self.plan.threads, "inter_op_threads": INTER_OP_THREADS,
                "allow_spinning": ALLOW_SPINNING == "1", "graphs": graphs,
                "heads_in_pytorch": sorted(self.heads)}


class GraphOutput(dict):
    """A graph's outputs by name, read as a model output's fields (`out.logits`); a field the graph does not
    give reads None, as a model's output field that was not asked for."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


__all__ = ["GraphOutput", "OrtEngine", "cache_root", "cached_record", "graph_key", "weights_checksum"]
