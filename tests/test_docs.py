"""README.md and docs/: links that resolve, commands that still exist, a front door that stays short.

Every command written in README.md or docs/*.md (in a code block, or inline in backticks) is
read: a `graphsplit` command must name a real subcommand and only flags that subcommand has; a
`python bench/x.py` or `python docs/x.py` script must exist and define every flag it is shown
with; any path into the repository (examples/, bench/, tests/, docs/, graphsplit/) must exist.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from graphsplit.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_DIRS = ("examples/", "bench/", "tests/", "docs/", "graphsplit/", ".ci/")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def commands(text: str) -> list[str]:
    """Every command line a page shows: code-block lines and inline code that start a command."""
    found = []
    for block in FENCE.findall(text):
        for line in block.splitlines():
            found.append(line.strip().removeprefix("$ "))
    found += INLINE.findall(FENCE.sub("", text))
    segments = [seg.strip() for line in found for seg in line.split("&&")]
    # `graphsplit transform, same cuts  2.09` in a benchmark's printout is not a command
    command = re.compile(r"(\w+=\S+ )*(graphsplit( --[a-z-]+)* ([a-z][a-z-]*|[A-Z]+)( |$)|python \S)")
    return [seg for seg in segments if command.match(seg)]


def words(command: str) -> list[str]:
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote in prose: split on spaces
        tokens = command.split()
    tokens = [t.strip("[]") for t in tokens]
    while tokens and re.match(r"\w+=", tokens[0]):  # ZOO_ARCH=T5 graphsplit ...
        tokens.pop(0)
    return [t for t in tokens if t]


def flags_of(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}


def check_paths(tokens: list[str]) -> list[str]:
    missing = []
    for token in tokens:
        path = token.split(":")[0].rstrip(",.;")
        if path.startswith(REPO_DIRS) and not (ROOT / path).exists():
            missing.append(path)
    return missing


def check_graphsplit(tokens: list[str]) -> list[str]:
    problems = []
    rest = tokens[1:]
    group_flags = flags_of(cli_main) | {"--version"}
    while rest and rest[0].startswith("--"):
        if rest[0] not in group_flags:
            problems.append(f"graphsplit has no option {rest[0]}")
        rest = rest[1:]
    if not rest or rest[0].isupper():  # `graphsplit COMMAND --help`: a placeholder
        return problems
    sub = cli_main.commands.get(rest[0])
    if sub is None:
        return problems + [f"no command 'graphsplit {rest[0]}'"]
    known = flags_of(sub)
    for token in rest[1:]:
        flag = token.split("=")[0]
        if re.fullmatch(r"--[a-z][\w-]*", flag) and flag not in known:
            problems.append(f"'graphsplit {rest[0]}' has no option {flag}")
    return problems


def check_python(tokens: list[str]) -> list[str]:
    if len(tokens) > 2 and tokens[1] == "-m":
        import importlib.util

        module = tokens[2]
        return [] if module == "pytest" or importlib.util.find_spec(module) else [f"no module {module}"]
    script = ROOT / tokens[1]
    if not tokens[1].endswith(".py"):
        return []
    if not script.exists():
        return [f"no script {tokens[1]}"]
    source = script.read_text()
    return [f"{tokens[1]} has no option {t}" for t in tokens[2:]
            if re.fullmatch(r"--[a-z][\w-]*", t.split("=")[0]) and f'"{t.split("=")[0]}"' not in source]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_pictures_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()) + IMAGE.findall(page.read_text()):
        if re.match(r"\w+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert broken == [], broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_shown_still_exists(page):
    problems = []
    shown = commands(page.read_text())
    for command in shown:
        tokens = words(command)
        problems += check_paths(tokens)
        problems += check_graphsplit(tokens) if tokens[0] == "graphsplit" else check_python(tokens)
    assert problems == [], problems
    if page.name in ("README.md", "guide.md", "figures.md"):
        assert shown, f"{page.name} shows no command: the reader has nothing to run"


def test_the_checker_finds_what_went_stale():
    # the checks above must be able to fail: a stale flag, command, script option and path each show
    assert check_graphsplit(words("graphsplit run examples/gpt.py --pp 2 --no-such-flag")) == [
        "'graphsplit run' has no option --no-such-flag"]
    assert check_graphsplit(words("graphsplit frobnicate x")) == ["no command 'graphsplit frobnicate'"]
    assert check_python(words("python bench/tp_step.py --no-such-option")) == [
        "bench/tp_step.py has no option --no-such-option"]
    assert check_paths(words("graphsplit run examples/nope.py:build --tp 2")) == ["examples/nope.py"]
    assert commands("see `graphsplit plan x.py --gpus 8` and\n```\n$ python bench/balance.py && ls\n```\n") == [
        "python bench/balance.py", "graphsplit plan x.py --gpus 8"]
    assert slug("What `--check` compares") == "what---check-compares"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"
    # it opens with exactly the two set-up commands, the second installing the test extras and
    # running the suite: what .ci/run reads and runs
    first_block = FENCE.search(text).group(1).strip().splitlines()
    assert lines[0].startswith("# ") and len(first_block) == 2, first_block
    assert "pip install -e ." in first_block[0] and "graphsplit run" in first_block[0]
    assert '".[test]"' in first_block[1] and first_block[1].endswith("pytest -q")
    assert "awk" in (ROOT / ".ci" / "run").read_text() and "README.md" in (ROOT / ".ci" / "run").read_text()
    assert "docs/images/report.png" in text and (ROOT / "docs" / "images" / "report.png").stat().st_size > 10_000
