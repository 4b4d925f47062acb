"""The README stays true: at most 150 lines, every `voxpipe` command it shows parses with the CLI (its
flags are in `--help`), every `make` target exists, every recipe it names is shipped, every link
of it and of docs/*.md resolves (its file, and its #anchor as GitHub renders headings). The commands
themselves run, in the README's order, in tests/test_readme_paths.py."""

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


FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without code blocks and code spans, where a `](` or a `#` is not markdown."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_` dropped,
    spaces to `-`, and `-1`, `-2` ... on repeats."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text(encoding="utf-8")),
                              re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def links(path: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text(encoding="utf-8")))


def broken_links(page: Path) -> list[str]:
    """Each relative link of a page whose file is missing or whose #anchor is no heading there."""
    broken = []
    for link in links(page):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        file = (page.parent / target).resolve() if target else page
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading with anchor #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page):
    """Every relative link of the README and docs/*.md names a file that exists and, with a #anchor, a
    heading of that page as GitHub renders it (so a renamed section fails here, not for a reader)."""
    assert not broken_links(page), f"{page.relative_to(ROOT)}: " + "; ".join(broken_links(page))


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## `voxpipe serve`: the API\n\n## Again\n\n## Again\n\n"
                    "[ok](#voxpipe-serve-the-api) [ok](#again-1) [ok](page.md#a-page) [web](https://x.org/#y)\n"
                    "[gone](#the-api) [gone](missing.md) `[code](#not-a-link)`\n\n"
                    "```\n[block](#nor-this)\n```\n")
    assert broken_links(page) == ["#the-api: no heading with anchor #the-api in page.md",
                                  "missing.md: no such file"]
