"""The README stays true: at most 150 lines, every `voxpipe` command it shows parses with the CLI (its
flags are in `--help`), every `make` target exists, every recipe it names is shipped, every link
resolves. The commands themselves run, in the README's order, in tests/test_readme_paths.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from voxpipe.cli import build_parser
from voxpipe.params import recipe_names

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def commands() -> list[str]:
    """Every command line in the README's code blocks and inline code."""
    blocks = re.findall(r"```(?:sh|console)?\n(.*?)```", README, re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    inline = re.findall(r"`((?:voxpipe|make|dvc) [^`]+)`", README)
    return [c for c in lines + inline if c.startswith(("voxpipe ", "make ", "dvc ")) and "<" not in c]


def test_readme_is_short():
    assert len(README.splitlines()) <= 150


@pytest.mark.parametrize("command", [c for c in commands() if c.startswith("voxpipe ")])
def test_voxpipe_commands_match_the_cli(command):
    build_parser().parse_args(shlex.split(command)[1:])  # SystemExit (an unknown flag) fails the test


def test_make_targets_exist_and_recipes_are_shipped():
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    used = {shlex.split(c)[1] for c in commands() if c.startswith("make ")}
    assert used and used <= targets, used - targets
    named = set(re.findall(r"`((?:demo-cpu|voxcpm2-[a-z0-9-]+))`", README)) | set(
        re.findall(r"--recipe ([\w-]+)", README))
    assert named and named <= set(recipe_names()), named - set(recipe_names())


def test_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
