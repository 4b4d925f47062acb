"""`Step.reads` (voxpipe/steps/) against the keys each step's code reads.

Step.reads makes a step's flags and, through voxpipe/dvcgen.py, its stage's DVC params, so a key the code
reads but the list lacks is a flag that is missing and a param DVC does not track. The keys read are found
with `ast`, from the step function through every function it can call, in its import closure: a call
`f()` or `mod.f()` is followed to the function that name is imported as or defined as in that module, a
method call `x.f()` to every method named `f`. A read is an attribute chain that spells a schema path
(`params.train.lr`, `self.params.register_.model_name`, `params.train.lora.r`), or one on a name
annotated with a section's class (`p: IngestParams` ... `p.workers`). Not seen: `getattr` with a computed
name, and reads on a value whose section class is not annotated. Seen and not read from the step's
params: `NOT_THE_STEPS` below, each with its reason.
"""

from __future__ import annotations

import ast
import functools

import pytest
from pydantic import BaseModel

from voxpipe.cli import STEPS, Step
from voxpipe.dvcgen import ROOT, step_closure
from voxpipe.params import Params

# keys a step's code reads on a Params that is not the one the step was given
NOT_THE_STEPS: dict[str, tuple[str, ...]] = {
    # a shard is ingested with the settings of the plan file (`ingest.plan`), not the command's
    "ingest-shard": ("ingest",),
    "ingest-merge": ("ingest",),
    # serve.base rebuilds the adapter as a LoraParams from the version's own lora_config.json
    # (serve/adapter.py), never from the command's train.lora
    "serve": ("train.lora",),
}


def schema(model: type[BaseModel], path: tuple[str, ...] = (), key: str = ""):
    """(python attribute path -> dotted key, class name -> dotted key) of every field and sub-section."""
    paths: dict[tuple[str, ...], str] = {}
    classes: dict[str, str] = {}
    for attr, info in model.model_fields.items():
        name = f"{key}{info.alias or attr}"
        paths[(*path, attr)] = name
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            classes[info.annotation.__name__] = name
            sub_paths, sub_classes = schema(info.annotation, (*path, attr), name + ".")
            paths |= sub_paths
            classes |= sub_classes
    return paths, classes


PATHS, CLASSES = schema(Params)
SECTION_PATH = {key: path for path, key in PATHS.items()}
LEAVES = {key for key in PATHS.values() if not any(k.startswith(key + ".") for k in PATHS.values())}


def attribute_chain(node: ast.Attribute) -> list[str] | None:
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    return [node.id, *reversed(out)] if isinstance(node, ast.Name) else None


def key_of(path: tuple[str, ...]) -> str | None:
    """The deepest schema key an attribute path spells from any of its positions, else None."""
    for start in range(len(path)):
        for end in range(len(path), start, -1):
            if path[start:end] in PATHS and PATHS[path[start:end]] in LEAVES:
                return PATHS[path[start:end]]
    return None


def reads(function: ast.FunctionDef) -> set[str]:
    typed = {}
    args = function.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        name = ast.unparse(arg.annotation).strip("'\"").split(".")[-1] if arg.annotation else ""
        if name in CLASSES:
            typed[arg.arg] = SECTION_PATH[CLASSES[name]]
    out = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and (chain := attribute_chain(node)):
            root = typed.get(chain[0])
            key = key_of((*root, *chain[1:])) if root else None
            if (key := key or key_of(tuple(chain[1:]))) is not None:
                out.add(key)
    return out


@functools.cache
def module_tree(file: str) -> ast.Module:
    return ast.parse((ROOT / file).read_text(encoding="utf-8"))


def module_of(file: str) -> str:
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def index(files: set[str]):
    """Per module: its top-level functions (a class: its constructors) and the names it imports; every method,
    by name; the module of each function."""
    functions: dict[tuple[str, str], list[ast.FunctionDef]] = {}
    imported: dict[tuple[str, str], tuple[str, str | None]] = {}
    methods: dict[str, list[ast.FunctionDef]] = {}
    owner: dict[int, str] = {}
    for file in files:
        module, tree = module_of(file), module_tree(file)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    imported[(module, alias.asname or alias.name)] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imported[(module, alias.asname or alias.name)] = (alias.name, None)
            elif isinstance(node, ast.FunctionDef):
                owner[id(node)] = module
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        methods.setdefault(item.name, []).append(item)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                functions[(module, node.name)] = [node]
            elif isinstance(node, ast.ClassDef):  # calling a class runs these (its others: by their name)
                functions[(module, node.name)] = [n for n in node.body if isinstance(n, ast.FunctionDef)
                                                  and n.name in ("__init__", "__post_init__")]
    return functions, imported, methods, owner


def step_reads(step: Step) -> set[str]:
    files = {f for f in step_closure(step) if f.endswith(".py")}
    functions, imported, methods, owner = index(files)

    def called(module: str, node: ast.expr) -> list[ast.FunctionDef]:
        if isinstance(node, ast.Name):
            return functions.get(imported.get((module, node.id), (module, node.id)), [])
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and (module, node.value.id) in imported:
                source, name = imported[(module, node.value.id)]
                return functions.get((source if name is None else f"{source}.{name}", node.attr), [])
            return methods.get(node.attr, [])
        return []

    module, name = step.target.split(":")
    todo, seen, out = list(functions[(module, name)]), set(), set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        out |= reads(fn)
        for node in ast.walk(fn):  # calls, and functions handed on as values (a callback, a thread target)
            if isinstance(node, ast.Name | ast.Attribute):
                todo += called(owner[id(fn)], node)
    return out


def covered(key: str, specs: tuple[str, ...]) -> bool:
    return any(key == s or key.startswith(s + ".") for s in specs)


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_a_step_reads_only_keys_of_its_step_reads(step):
    missing = sorted(k for k in step_reads(step)
                     if not covered(k, step.reads) and not covered(k, NOT_THE_STEPS.get(step.name, ())))
    assert not missing, (f"`voxpipe {step.name}` reads {missing}, not in its Step.reads (its voxpipe/steps "
                         "module): add them there (untracked or hide, when they change no result), then "
                         "`make generate`")


def test_the_walk_follows_calls_and_typed_sections():
    train = next(s for s in STEPS if s.name == "train")
    assert {"train.lr", "plan.headroom", "model.base"} <= step_reads(train)  # headroom: in train/plan.py
    ingest = next(s for s in STEPS if s.name == "ingest")
    assert {"ingest.workers", "ingest.min_seconds"} <= step_reads(ingest)  # `p: IngestParams`
