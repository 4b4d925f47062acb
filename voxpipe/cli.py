"""`voxpipe <step>`: one subcommand per pipeline step.

Every step flag is a `section.key` of params.yaml, generated from the schema (voxpipe/steps/:
the flag's help is the field's description). Precedence: params file < `--recipe` < `--set` < flag.
Step modules are imported only when their step runs, so `voxpipe --help` stays fast. A flag means one
thing: no prefix matching (`allow_abbrev=False`), and a model flag names the same model in every step:
`--model-base` is the base checkpoint (model.base), `--model` the fine-tune (evaluate, register,
synthesize).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import os
import sys
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from voxpipe import __version__
from voxpipe.errors import StepError
from voxpipe.outlock import guard_step
from voxpipe.params import Params, load_params, params_yaml
from voxpipe.paramspec import Key, base_type, keys
from voxpipe.secrets import scrub
from voxpipe.steps import Step, all_steps

log = logging.getLogger("voxpipe")

# in pipeline order (voxpipe/steps/: each module its section and steps): `voxpipe --help` lists them so
STEPS: tuple[Step, ...] = all_steps()







@dataclass(frozen=True)
class Flag:
    name: str  # "--max-steps"
    key: Key
    kwargs: dict[str, Any]


def _flag_name(key: str, own: str) -> str:
    parts = key.split(".")
    if parts[0] == own:
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] == "enabled":  # train.lora.enabled: --lora
        parts = parts[:-1]
    return "--" + "-".join(parts).replace("_", "-")


def _integer(text: str) -> int:
    """An int flag's value; integral float notation (1e9) too, so the schema's bound names the problem
    rather than argparse's "invalid int value"."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not value.is_integer() or abs(value) >= 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (or too large for one)")
    return int(value)


def _kwargs(key: Key) -> dict[str, Any] | None:
    """argparse settings for a key's type; None for mappings (those are set in a file or with --set)."""
    inner, _ = base_type(key.annotation)
    if typing.get_origin(inner) in (typing.Union, types.UnionType):  # one or a mapping: a flag sets one
        inner = typing.get_args(inner)[0]
    origin = typing.get_origin(inner)
    if inner is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is Literal:
        choices = list(typing.get_args(inner))
        return {"choices": choices, "type": type(choices[0])}
    if origin is list:
        (item,) = typing.get_args(inner)
        if item not in (str, int, float):
            return None
        # --manifest a --manifest b: both
        return {"nargs": "+", "action": "extend", "type": item, "metavar": key.key.rsplit(".", 1)[-1].upper()}
    if inner in (str, int, float):
        return {"type": _integer if inner is int else inner, "metavar": key.key.rsplit(".", 1)[-1].upper()}
    return None


def step_flags(step: Step) -> list[Flag]:
    flags = []
    for spec in step.reads:
        for key in keys(spec):
            kwargs = _kwargs(key)
            if kwargs is not None and key.key not in step.hide:
                flags.append(Flag(_flag_name(key.key, step.own), key, kwargs))
    return flags


def _help(key: Key) -> str:
    default = "null" if key.default is None else key.default
    text = f"{key.description} " if key.description else ""
    wired = ", wired by the pipeline" if key.wired else ""
    return f"{text}[{key.key}, default {default}{wired}]".replace("%", "%%")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default=None, help="params file (default: ./params.yaml)")
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="layer recipes/NAME.yaml (or a file) over the params file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one params key (repeatable)")


def _overview() -> str:
    width = max(len(s.name) for s in STEPS) + 2
    lines = [f"  {s.name:<{width}}{s.help}" for s in STEPS]
    lines += ["", "other commands:",
              f"  {'params':<{width}}print the effective params (file < recipe < --set)",
              f"  {'dvc-yaml':<{width}}write dvc.yaml from the steps' descriptors (--check: only compare)"]
    return "steps, in pipeline order:\n" + "\n".join(lines) + "\n\n`voxpipe <step> --help`: its flags."


class _HelpFormatter(argparse.HelpFormatter):
    """Help lines wrapped at spaces only: a path (exports/step-N-ema/) or a flag name stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False everywhere: a prefix is no flag (`encode --model X` would mean --model-base)
    parser = argparse.ArgumentParser(prog="voxpipe", description=__doc__.splitlines()[0], epilog=_overview(),
                                     allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"voxpipe {__version__}")
    sub = parser.add_subparsers(dest="step", required=True, metavar="<step>")
    for step in STEPS:
        sp = sub.add_parser(step.name, description=step.help, allow_abbrev=False,
                            formatter_class=_HelpFormatter)
        _common(sp)
        for flag in step_flags(step):
            sp.add_argument(flag.name, dest=flag.key.key, default=None, help=_help(flag.key), **flag.kwargs)
    tool = sub.add_parser("params", allow_abbrev=False, description="print the effective params as YAML "
                          "(params file < --recipe < --set), or write them: `voxpipe params --recipe NAME "
                          "--write params.yaml` makes `dvc repro` run the recipe")
    _common(tool)
    tool.add_argument("--write", metavar="FILE", default=None, help="write to FILE instead of stdout")
    dvc = sub.add_parser("dvc-yaml", allow_abbrev=False, description="write dvc.yaml whole from the steps' "
                         "descriptors (voxpipe/steps/): each stage's cmd, data deps and outs as declared, "
                         "its "
                         "code deps (the step's import closure) and params (the keys it reads that change "
                         "its result) as computed")
    dvc.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each difference")
    dvc.add_argument("--file", default="dvc.yaml", help="the dvc.yaml (default: ./dvc.yaml)")
    return parser


def _on_first_call(target: str) -> Callable[..., Any]:
    """The callable `module:attr`, its module imported when it is first called (maybe never)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)
    return call


def step_params(step: Step, args: argparse.Namespace) -> Params:
    """The params a step's parsed command line resolves to (file, recipe, --set, flags), validated."""
    flags = step_flags(step)
    return load_params(args.params, args.overrides, {f.key.key: getattr(args, f.key.key) for f in flags},
                       recipe=args.recipe)


def run_step(step: Step, args: argparse.Namespace) -> Any:
    flags = step_flags(step)
    params = step_params(step, args)
    module, func = step.target.split(":")
    arg = params if step.section is None else params.section(step.section)
    out_key = next((f.key.key for f in flags if f.name == "--out" and step.out_folder), None)
    with guard_step(params.flat()[out_key] if out_key else None, step.name):  # one writer per --out
        wired = {name: _on_first_call(target) for name, target in step.wires}
        return getattr(importlib.import_module(module), func)(arg, **wired)


def setup_logging() -> None:
    """One logging setup for every step: INFO lines on stderr, from rank 0 only under torchrun (the
    other ranks log warnings and errors)."""
    from voxpipe.secrets import ScrubFilter

    level = logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S", stream=sys.stderr)
    for handler in logging.getLogger().handlers:  # every logger's records pass the root's handlers
        if not any(isinstance(f, ScrubFilter) for f in handler.filters):
            handler.addFilter(ScrubFilter())


def _params_command(args: argparse.Namespace) -> int:
    text = params_yaml(load_params(args.params, args.overrides, recipe=args.recipe))
    if args.write is None:
        sys.stdout.write(text)
    else:
        from voxpipe.files import atomic_write_text

        atomic_write_text(Path(args.write), text)
        log.info("wrote %s", args.write)
    return 0


def _dvc_yaml_command(args: argparse.Namespace) -> int:
    # by name, as the steps are: a tool of the repo, no part of any stage's code deps
    problems = _on_first_call("voxpipe.dvcgen:dvc_yaml")(Path(args.file), STEPS, check=args.check)
    if problems and args.check:
        print(f"voxpipe dvc-yaml: {args.file} is stale (`voxpipe dvc-yaml` rewrites it):\n  "
              + "\n  ".join(problems), file=sys.stderr)
        return 1
    log.info("%s: %s", args.file, f"rewritten ({len(problems)} differences)" if problems else "up to date")
    return 0


TOOLS = {"dvc-yaml": _dvc_yaml_command, "params": _params_command}  # the other commands


def native_crash_safety() -> None:
    """A native crash (SIGSEGV in numba- or C-compiled code) leaves a Python stack of every thread on
    stderr, so a pod's log says where it died; and numba's on-disk cache goes to a per-user folder, not
    into site-packages next to librosa, where concurrent runs from one virtualenv corrupted it (every
    `evaluate` then died in `librosa.pyin` with SIGSEGV and no message) and a read-only image cannot
    write. Must run before anything imports numba (it reads NUMBA_CACHE_DIR once, at import); a
    NUMBA_CACHE_DIR the user set is kept."""
    if not faulthandler.is_enabled():
        faulthandler.enable(file=sys.stderr, all_threads=True)
    if "NUMBA_CACHE_DIR" not in os.environ:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        os.environ["NUMBA_CACHE_DIR"] = os.path.join(cache, "voxpipe", "numba")


def main(argv: list[str] | None = None) -> int:
    native_crash_safety()
    args = build_parser().parse_args(argv)
    setup_logging()
    if args.step in TOOLS:
        try:
            return TOOLS[args.step](args)
        except StepError as e:
            print(f"voxpipe {args.step}: error: {scrub(str(e))}", file=sys.stderr)
            return 1
    step = next(s for s in STEPS if s.name == args.step)
    try:
        result = run_step(step, args)
    except StepError as e:
        if not e.every_rank or os.environ.get("RANK", "0") == "0":  # a collective error: rank 0 says it
            print(f"voxpipe {step.name}: error: {scrub(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # under torchrun, its launcher says it once for all ranks
            print(f"voxpipe {step.name}: interrupted; what was done is kept, and the same command resumes",
                  file=sys.stderr)
        return 130
    summary = getattr(result, "summary", None)
    text = summary() if callable(summary) else ""
    if text:
        print(text)
    return int(getattr(result, "exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
