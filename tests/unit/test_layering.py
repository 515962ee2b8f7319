"""Import layering of the package (DESIGN.md, "Layout and dependency direction"), checked from source.

Every module under src/bertforge is parsed with `ast`; every import statement counts, including those
inside functions: there are no allowances. A module may import from a lower row, from its own component,
or from the foundations (`constants`, `errors`, `storage`, `lazy`), nothing else. Extra rules: tokenization
and metrics never import torch, data never imports the model, nothing imports transformers, and the
package imports nothing of the repository outside itself (`benchmarks`, `tests`). Modules of the table that
do not exist yet are simply absent from the walk; a module the table does not know fails the test, so the
table grows with the tree.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "bertforge"
SOURCE_ROOT = Path(__file__).resolve().parents[2] / "src"

# Importable by every module; they import nothing of bertforge but each other.
FOUNDATIONS = {"constants", "errors", "storage", "lazy"}
# Component (module path below `bertforge`, longest prefix wins) -> row (docs/design.md, "Layers").
# The generic checkpoint reader/writer sits below the models, which load through it; the family registry,
# which maps a directory's architecture to a class, sits above them.
ROWS = {
    "configuration": 0,
    "runtime": 0,
    "tokenization": 0,
    "metrics": 0,
    "interop": 0,
    "model.config": 0,
    "initialisation": 0,  # when constructors initialise: asked by the models, set by the loader below them
    "checkpoint_format": 1,
    "checkpoint_integrity": 0,
    "processes": 1,
    "model": 2,
    "data": 2,
    "families": 3,
    "engine": 4,
    "evaluation": 5,
    "conversion": 5,
    "training": 6,
    "inference": 6,
    "retrieval": 7,
    "serving": 8,
    "demo": 8,
    "cli": 9,
    "__main__": 10,
}
# Components that must not import a given third-party top-level package or bertforge component.
FORBIDDEN = {
    "tokenization": ("torch",),
    "metrics": ("torch",),
    "data": ("bertforge.model",),
}
NEVER_IMPORTED = ("transformers",)
# Third-party packages only some components may import (a component's submodules included): the web framework
# is the server's alone, so the library, the CLI and the scheduler load without the `serve` extra.
WEB_FRAMEWORK = ("fastapi", "fastapi_offline", "starlette", "uvicorn", "pydantic", "prometheus_client", "orjson")
ONLY = {package: ("serving",) for package in WEB_FRAMEWORK}
# Folders of the repository that are not part of the installed package: importing them works only from a
# checkout, so the package must not.
OUTSIDE_PACKAGE = ("benchmarks", "tests")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (resolved for relative and `from bertforge import x`)
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def lazy_exports(path: Path) -> dict[str, str]:
    """A package's `_LAZY` table: names it resolves on attribute access, to the module they come from, so
    `from bertforge import BertModel` counts as importing `bertforge.model.bert`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def dynamic_import(node: ast.AST) -> str | None:
    """The module named by `importlib.import_module("...")` / `__import__("...")` with a literal name."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def inside_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def collect_imports(root: Path) -> list[Import]:
    """Every import statement of every module below `root / PACKAGE`."""
    modules = {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    lazy = {name: lazy_exports(path) for name, path in modules.items() if path.name == "__init__.py"}
    found: list[Import] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            targets: list[str] = []
            if dynamic_import(node):
                targets = [dynamic_import(node)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        targets.append(submodule)
                    elif alias.name in lazy.get(base, {}):
                        targets.append(lazy[base][alias.name])
                    else:
                        targets.append(base)
            for target in targets:
                found.append(Import(name, target, node.lineno, inside_function(node, parents)))
    return found


def component(module: str) -> str | None:
    """The `ROWS` / `FOUNDATIONS` key a bertforge module belongs to (None for the package root)."""
    rest = module.removeprefix(PACKAGE).lstrip(".")
    if not rest:
        return None
    parts = rest.split(".")
    for size in range(len(parts), 0, -1):
        key = ".".join(parts[:size])
        if key in ROWS or key in FOUNDATIONS:
            return key
    return rest


def violations(imports: list[Import]) -> list[str]:
    problems: list[str] = []
    for item in imports:
        source = component(item.module)
        top = item.target.split(".")[0]
        if top in NEVER_IMPORTED:
            problems.append(f"{item.where()} (the package never imports {top})")
        if top in ONLY and not (source or "").startswith(ONLY[top]):
            problems.append(f"{item.where()} (only {', '.join(ONLY[top])} may import {top})")
        if top in OUTSIDE_PACKAGE:
            problems.append(f"{item.where()} ({top}/ is a repository folder, not part of the package)")
        if source is not None:
            for banned in FORBIDDEN.get(source.split(".")[0], ()):
                if item.target == banned or item.target.startswith(banned + "."):
                    problems.append(f"{item.where()} ({source} must not import {banned})")
        if top != PACKAGE or source is None:
            continue
        target = component(item.target)
        if target is None or target in FOUNDATIONS or target == source:
            continue
        if source in FOUNDATIONS:
            problems.append(f"{item.where()} ({source} is a foundation and imports only constants/errors)")
        elif source not in ROWS:
            problems.append(f"{item.module}: component {source!r} has no row in the layering table "
                            "(tests/unit/test_layering.py ROWS); add it where DESIGN.md puts it")
        elif target not in ROWS:
            continue  # reported once for the unknown module itself
        elif ROWS[target] >= ROWS[source]:
            where = "inside a function" if item.in_function else "at module level"
            problems.append(f"{item.where()} {where} (row {ROWS[source]} {source} may import only rows below "
                            f"{ROWS[source]}; {target} is row {ROWS[target]})")
    return sorted(set(problems))


def test_layering_imports_go_downward_only():
    imports = collect_imports(SOURCE_ROOT)
    assert imports, f"no modules found under {SOURCE_ROOT / PACKAGE}"
    problems = violations(imports)
    assert not problems, "import layering violations:\n" + "\n".join(problems)


def test_layering_every_module_has_a_row():
    modules = {module_name(p, SOURCE_ROOT) for p in (SOURCE_ROOT / PACKAGE).rglob("*.py")}
    unknown = sorted(m for m in modules if component(m) is not None
                     and component(m) not in ROWS and component(m) not in FOUNDATIONS)
    assert not unknown, f"modules with no row in the layering table: {unknown}; add them to ROWS"


def test_layering_model_classes_load_without_the_registry():
    """`from_pretrained` uses only the generic reader below the models, never the registry above them."""
    imports = [i for i in collect_imports(SOURCE_ROOT)
               if i.module.startswith(("bertforge.model", "bertforge.checkpoint_format"))]
    assert imports
    assert not [i.where() for i in imports if i.target.startswith("bertforge.families")]


# --- retrieval's room (issue #47): the vector folder's format has one home -------------------------------

# What serving and inference may import of retrieval: its entry points, never an index's or the store's insides.
RETRIEVAL_PUBLIC = ("bertforge.retrieval", "bertforge.retrieval.searcher", "bertforge.retrieval.index_locations")
# The vector folder's file names as code writes them (`store.SHARD_FILES`, `store.PROGRESS_NAME`) and its format
# name: a module that spells one knows the format, which is `store.py`'s alone.
SHARD_NAME_PATTERN = re.compile(
    r"""["'](?:vectors|codes|indptr|terms|weights|offsets|multivectors|ids|spans|fields|shard)-\{|bertforge-embeddings""")


def test_layering_retrieval_never_imports_the_web_framework():
    found = [item.where() for item in collect_imports(SOURCE_ROOT) if item.module.startswith("bertforge.retrieval")
             and item.target.split(".")[0] in WEB_FRAMEWORK]
    assert not found, "retrieval/ imports the web framework:\n" + "\n".join(found)


def test_layering_serving_and_inference_import_only_retrieval_entry_points():
    found = [item.where() for item in collect_imports(SOURCE_ROOT)
             if item.module.startswith(("bertforge.serving", "bertforge.inference"))
             and item.target.startswith("bertforge.retrieval")
             and (item.module.startswith("bertforge.inference") or item.target not in RETRIEVAL_PUBLIC)]
    assert not found, "retrieval internals imported from serving/ or inference/:\n" + "\n".join(found)


def test_layering_only_the_store_names_shard_files():
    found = [f"{path.relative_to(SOURCE_ROOT)}:{number}" for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))
             if path.relative_to(SOURCE_ROOT / PACKAGE).as_posix() != "retrieval/store.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if SHARD_NAME_PATTERN.search(line)]
    assert not found, "a vector folder's file names spelled outside retrieval/store.py:\n" + "\n".join(found)
    store = (SOURCE_ROOT / PACKAGE / "retrieval" / "store.py").read_text(encoding="utf-8")
    assert len(SHARD_NAME_PATTERN.findall(store)) >= 8  # the pattern finds what it looks for


# --- the checker itself, on a small fake tree ------------------------------------------------------------

def write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / PACKAGE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_layering_checker_flags_each_kind_of_violation(tmp_path):
    write_tree(tmp_path, {
        "__init__.py": "_LAZY = {'BertModel': 'bertforge.model.bert'}\n",
        "errors.py": "",
        "model/__init__.py": "",
        "model/bert.py": "from bertforge.errors import InputError\n"
                         "def save():\n    from bertforge.families.registry import load_model\n",
        "model/heads.py": "from bertforge.families.registry import load_model\nimport benchmarks.run\n",
        "tokenization/vocab.py": "import torch\nfrom . import wordpiece\n",
        "tokenization/wordpiece.py": "def f():\n    from bertforge.data import corpus\n"
                                     "import importlib\nimportlib.import_module('torch.nn')\n",
        "data/__init__.py": "",
        "data/corpus.py": "from bertforge import BertModel\nimport transformers\n",
        "families/__init__.py": "",
        "families/registry.py": "from bertforge.model.bert import BertModel\nfrom ..model import heads\n",
        "inference/__init__.py": "",
        "inference/pipelines.py": "from bertforge.serving import app\n",
        "serving/__init__.py": "",
        "serving/app.py": "from bertforge.inference.pipelines import Pipeline\n",
        "plugins.py": "from bertforge.errors import ConfigError\nfrom bertforge.model import bert\n",
        "inference/scheduler.py": "def f():\n    import fastapi\n",
        "serving/guards.py": "import starlette.requests\n",
    })
    problems = violations(collect_imports(tmp_path))
    text = "\n".join(problems)
    assert "bertforge.model.heads:1 imports bertforge.families.registry at module level" in text
    assert "bertforge.model.bert:3 imports bertforge.families.registry inside a function" in text  # no allowance
    assert "bertforge.model.heads:2 imports benchmarks.run (benchmarks/ is a repository folder" in text
    assert "bertforge.tokenization.vocab:1 imports torch" in text
    assert "bertforge.tokenization.vocab:2" not in text  # same component, relative import
    assert "bertforge.tokenization.wordpiece:2 imports bertforge.data.corpus" in text  # inside a function
    assert "bertforge.tokenization.wordpiece:4 imports torch.nn" in text  # importlib with a literal name
    assert "bertforge.data.corpus:1 imports bertforge.model.bert (data must not import bertforge.model)" in text
    assert "bertforge.data.corpus:2 imports transformers" in text
    assert "bertforge.inference.pipelines:1 imports bertforge.serving.app" in text
    assert "bertforge.serving.app:1" not in text
    assert "component 'plugins' has no row" in text
    assert "bertforge.inference.scheduler:2 imports fastapi (only serving may import fastapi)" in text
    assert "bertforge.serving.guards" not in text
    assert not any(p.startswith("bertforge.families") for p in problems)  # downward, absolute and relative


# --- family knowledge stays in families/; rooms a reader can hold --------------------------------------

# Names the issue #18 redesign retired: a family is never "None", and a setting has one name.
RETIRED_NAMES = ("family is None", "family is not None", "FLAT_KEYS", "nest_flat_keys", "reader_options",
                 "finetuning_record", "finetune_key")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def family_names() -> set[str]:
    """Every family's registry name and route ("tagging", "tag"); aliases that are ordinary words of other
    vocabularies ("text" corpora, "regression" problem kinds) are not names a consumer dispatches on."""
    from bertforge.families import registry

    return {name for family in registry.FAMILIES for name in (family.name, family.task) if name}


def test_layering_no_family_name_compared_outside_families():
    """Outside `families/` nobody asks "is this the tagging family?": a comparison (==, !=, in) with a
    family's name or alias as a string literal is family knowledge in the wrong room."""
    names = family_names()
    found = []
    for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py")):
        # metrics/ (row 0, below the families) names its own metric kinds, "classification" scores among them.
        if path.relative_to(SOURCE_ROOT / PACKAGE).parts[0] in ("families", "metrics"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            for operand in (node.left, *node.comparators):
                values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in names:
                        found.append(f"{path.relative_to(SOURCE_ROOT)}:{node.lineno} compares {value.value!r}")
    assert not found, "family names compared outside families/:\n" + "\n".join(found)


def test_layering_retired_names_are_gone():
    found = [f"{path.relative_to(SOURCE_ROOT)}: {name}" for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))
             for name in RETIRED_NAMES if name in path.read_text(encoding="utf-8")]
    assert not found, "\n".join(found)


def import_graph(root: Path) -> dict[str, dict[str, list[Import]]]:
    """module -> {a module of the package it imports: the statements that do}, from `collect_imports`: every
    statement, at module level or inside a function; `from pkg.mod import name` imports `pkg.mod`, and
    `from pkg import name` imports `pkg` itself unless `name` is a module of it or a name of its `_LAZY` table."""
    modules = {module_name(p, root) for p in (root / PACKAGE).rglob("*.py")}
    graph: dict[str, dict[str, list[Import]]] = {module: {} for module in modules}
    for item in collect_imports(root):
        target = item.target
        while target and target not in modules:  # a name of a module: that module (or its package)
            target = target.rpartition(".")[0]
        if target and target != item.module:
            graph[item.module].setdefault(target, []).append(item)
    return graph


def import_circles(graph: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """The groups of modules that import each other around a loop: each module of a group reaches every other
    by imports (a strongly connected component of the graph, of two modules or more), sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:  # `module` opened this group: the stack above it is the group
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(circles)


def test_layering_no_import_circles():
    """No modules of the package import each other around a loop, inside one room (`inference/`, `retrieval/`)
    or across rooms. Every import counts, a deferred one inside a function too: an import put off until a call
    still ties the two modules, so it hides a circle rather than breaking it (the code that both sides need
    moves to a module below both instead). A package's `__init__` counts as a module: one that imports its
    modules eagerly runs those imports; a `_LAZY` table (`bertforge.lazy`) imports nothing."""
    graph = import_graph(SOURCE_ROOT)
    circles = import_circles(graph)
    found = [f"{' <-> '.join(circle)}, tied by:\n" + "\n".join(dict.fromkeys(  # one line per statement
        f"  {item.where()} {'inside a function' if item.in_function else 'at module level'}"
        for module in circle for target in sorted(graph[module]) if target in circle for item in graph[module][target]))
        for circle in circles]
    assert not found, "import circles:\n" + "\n".join(found)


def test_layering_circle_finder_sees_deferred_and_module_level_loops(tmp_path):
    write_tree(tmp_path, {
        "__init__.py": "",
        "room/__init__.py": "",
        "room/a.py": "from bertforge.room.b import B\n",
        "room/b.py": "def load():\n    from bertforge.room import a\n",  # deferred, and through the package
        "room/c.py": "from bertforge.room.a import A\n",  # imports into the circle, not part of it
        "p.py": "import bertforge.q\n",
        "q.py": "from bertforge.r import R\n",
        "r.py": "from bertforge import p\n",  # a loop of three modules across rooms
        "face/__init__.py": "_LAZY = {'Thing': 'bertforge.face.thing'}\n",
        "face/thing.py": "Thing = 1\n",
        "face/user.py": "from bertforge.face import Thing\n",  # the lazy table's module, not the package
    })
    graph = import_graph(tmp_path)
    assert import_circles(graph) == [["bertforge.p", "bertforge.q", "bertforge.r"],
                                     ["bertforge.room.a", "bertforge.room.b"]]
    assert [item.in_function for item in graph["bertforge.room.b"]["bertforge.room.a"]] == [True]
    assert set(graph["bertforge.face.user"]) == {"bertforge.face.thing"}


def test_layering_rooms_fit_in_one_sitting():
    long_files, long_functions = [], []
    for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(SOURCE_ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(SOURCE_ROOT)}:{node.lineno} {node.name}: {size} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)


# --- the engine's room (DESIGN.md principle 17) ------------------------------------------------------------

# What prepares a model to run: only `engine/` imports these (the export command's modules are not among them).
CONVERTERS = ("bertforge.engine.int8", "bertforge.engine.bf16", "bertforge.engine.linears",
              "bertforge.engine.layer_graph", "bertforge.engine.row_chunks", "bertforge.engine.row_buckets",
              "bertforge.engine.onnxruntime")
# Where a forward pass may enter autocast: the engines (`Engine.running`) and the training loop; `runtime` writes
# the context once.
AUTOCAST_ROOMS = ("engine", "training", "runtime")


def package_files() -> list[tuple[str, Path]]:
    """(component's first part, path) of every module of the package."""
    return [(path.relative_to(SOURCE_ROOT / PACKAGE).parts[0].removesuffix(".py"), path)
            for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))]


def test_layering_only_the_engine_imports_converters_and_onnxruntime():
    found = [item.where() for item in collect_imports(SOURCE_ROOT)
             if not item.module.startswith("bertforge.engine")
             and (item.target.startswith(CONVERTERS) or item.target.split(".")[0] == "onnxruntime")]
    assert not found, "converters or onnxruntime imported outside engine/:\n" + "\n".join(found)


# Within engine/: the ONNX Runtime engine and the export it runs (what `bertforge export` writes).
ONNXRUNTIME_ROOMS = ("bertforge.engine.onnxruntime", "bertforge.engine.onnx_export", "bertforge.engine.onnx_graph")


def test_layering_only_the_onnxruntime_engine_and_the_export_import_onnxruntime():
    found = [item.where() for item in collect_imports(SOURCE_ROOT)
             if item.target.split(".")[0] == "onnxruntime" and item.module not in ONNXRUNTIME_ROOMS]
    assert not found, "onnxruntime imported outside the engine's ONNX rooms:\n" + "\n".join(found)
    users = {item.module for item in collect_imports(SOURCE_ROOT) if item.target.split(".")[0] == "onnxruntime"}
    assert "bertforge.engine.onnxruntime" in users  # the checker sees the engine's (function-level) import


def autocast_entries(tree: ast.AST) -> list[int]:
    """Lines that call an `autocast` (torch.autocast, torch.amp.autocast, runtime.autocast, a bare name)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "autocast":
                lines.append(node.lineno)
    return lines


def test_layering_only_the_engine_and_training_enter_autocast():
    found = [f"{path.relative_to(SOURCE_ROOT)}:{line}" for room, path in package_files() if room not in AUTOCAST_ROOMS
             for line in autocast_entries(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "autocast entered outside engine/ and training/:\n" + "\n".join(found)


def precision_defaults(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a precision name is written as a default: a `precision` parameter's default, a `default=` of
    an argparse `--precision`-like flag, a `precision` field's `setting(...)` default."""
    def named(value) -> bool:
        return isinstance(value, ast.Constant) and value.value in names

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            positional = arguments.posonlyargs + arguments.args
            pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
            pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
            lines += [d.lineno for a, d in pairs if "precision" in a.arg and named(d)]
        elif isinstance(node, ast.Call):
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any("precision" in flag for flag in flags):
                lines += [k.value.lineno for k in node.keywords if k.arg == "default" and named(k.value)]
        elif isinstance(node, ast.AnnAssign) and "precision" in getattr(node.target, "id", ""):
            value = node.value
            if named(value) or (isinstance(value, ast.Call) and value.args and named(value.args[0])):
                lines.append(node.lineno)
    return lines


def test_layering_precision_defaults_are_written_once_in_runtime():
    from bertforge.runtime import PRECISIONS

    names = set(PRECISIONS)
    found = [f"{path.relative_to(SOURCE_ROOT)}:{line}" for room, path in package_files() if room != "runtime"
             for line in precision_defaults(ast.parse(path.read_text(encoding="utf-8")), names)]
    assert not found, "a precision name written as a default outside runtime.py (use runtime.DEFAULT_PRECISION " \
                      "or DEFAULT_TRAINING_PRECISION):\n" + "\n".join(found)


def device_or_tracing_questions(tree: ast.AST) -> list[str]:
    """`x.device.type` / `.is_cpu` / `.is_cuda` reads and tracing/compiling/scripting checks, by line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "type" and isinstance(node.value, ast.Attribute) and node.value.attr == "device":
                found.append(f"{node.lineno}: device type")
            elif node.attr in ("is_cpu", "is_cuda"):
                found.append(f"{node.lineno}: {node.attr}")
            elif node.attr in ("is_tracing", "is_compiling", "is_scripting", "is_dynamo_compiling"):
                found.append(f"{node.lineno}: {node.attr}")
    return found


def test_layering_the_encoder_asks_no_device_and_no_tracing_question():
    path = SOURCE_ROOT / PACKAGE / "model" / "bert.py"
    found = device_or_tracing_questions(ast.parse(path.read_text(encoding="utf-8")))
    assert not found, f"{path.relative_to(SOURCE_ROOT)} is a plain encoder (the engine runs it):\n" + "\n".join(found)


def test_layering_engine_invariant_checkers_find_what_they_look_for():
    code = ("import torch\n"
            "def f(x, precision='fp32', *, other_precision='int8'):\n"
            "    with torch.autocast('cpu'):\n"
            "        return x.device.type == 'cpu' or torch.jit.is_tracing()\n"
            "p.add_argument('--precision', default='bf16')\n"
            "class C:\n    precision: str = setting('auto', 'help')\n")
    tree = ast.parse(code)
    assert autocast_entries(tree) == [3]
    assert precision_defaults(tree, {"fp32", "int8", "bf16", "auto"}) == [2, 2, 5, 7]
    assert [line.split(":")[0] for line in device_or_tracing_questions(tree)] == ["4", "4"]


# --- the vector database's client stays in one room --------------------------------------------------------------

# The only modules that import qdrant_client: the export and the search of a Qdrant collection, and its filters
# (split from it by concern).
QDRANT_MODULE = "bertforge.retrieval.qdrant_collection"
QDRANT_MODULES = (QDRANT_MODULE, "bertforge.retrieval.qdrant_filters")


def test_layering_only_the_qdrant_module_imports_qdrant_client():
    imports = collect_imports(SOURCE_ROOT)
    assert any(item.module == QDRANT_MODULE and item.target.startswith("qdrant_client") for item in imports)
    found = [item.where() for item in imports
             if item.target.split(".")[0] == "qdrant_client" and item.module not in QDRANT_MODULES]
    assert not found, f"qdrant_client imported outside {QDRANT_MODULES}:\n" + "\n".join(found)
