"""The README's commands, run as written, so the README cannot drift from the code.

Convention (stated in the README): a ```sh block holds commands a reader runs as written from the repository
root of a fresh clone, top to bottom; a ```text block is a synopsis with placeholders and is not run.  A command
that is meant to fail ends with a comment `# exits N`.  The set-up commands (venv, pip) are not re-run: the test
runs in the environment they made, and only the part of a set-up line after its last `pip install ... &&` is run.

The fast default test checks every ```sh command statically: its program is one of the project's commands, every
flag it passes is one that command's parser knows, and every input path it names exists in the repository.  The
slow test runs the blocks in order in a scratch copy of the repository's data/, scripts/ and docs/ folders and
checks each exit status (all but the test-suite command itself, which CI runs: see `runs_the_test_suite`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODULES = {"model.solve", "model.evaluate", "model.sweep", "model.calibrate", "model.export", "model.audit",
           "model.replay"}
SCRIPTS = {f"shapeplan-{m.split('.')[1]}": m for m in MODULES}
EXIT = re.compile(r"#\s*exits\s+(\d+)\s*$")


@dataclass(frozen=True)
class Command:
    """One shell command of the README: its text, where it is, and the exit status the README promises."""

    text: str
    line: int
    expect: int


def sh_commands(text: str) -> list[Command]:
    """The commands of every ```sh block in order, continuation lines joined, comments split off."""
    commands: list[Command] = []
    inside = False
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            inside = raw.strip() == "```sh" if not inside else False
            continue
        if not inside or (not pending and (not raw.strip() or raw.lstrip().startswith("#"))):
            continue
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        expect = EXIT.search(line)
        body = split_comment(line)
        if "pip install" in body:
            body = body.rsplit("&&", 1)[1].strip() if "&&" in body.rsplit("pip install", 1)[1] else ""
        if body:
            commands.append(Command(body, start, int(expect.group(1)) if expect else 0))
    return commands


def split_comment(line: str) -> str:
    """The line without a trailing shell comment (a `#` outside quotes that starts a word)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def module_of(words: list[str]) -> tuple[str, list[str]] | None:
    """The project command a word list runs and its arguments (None for any other program)."""
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1] == "-m" and words[2] in MODULES:
        return words[2], words[3:]
    if words and words[0] in SCRIPTS:
        return SCRIPTS[words[0]], words[1:]
    return None


@functools.cache
def parser_flags(module: str, mode: tuple[str, ...] = ()) -> set[str]:
    """Every option string the command's argument parser accepts, read from its --help, run in this process (a
    subprocess per command cost seconds each); ``mode``: words that select another parser, as `--cost-model
    serving` does for model.audit and model.solve."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        importlib.import_module(module).main([*mode, "--help"])
    assert stop.value.code == 0, out.getvalue()
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", out.getvalue()))


def runs_the_test_suite(command: Command) -> bool:
    """Whether the command is the test run itself (`python -m pytest`): this test is part of that suite, and
    the scratch copy has no tests/ to collect (pytest's exit 5), so the slow run leaves it to CI, whose
    `.ci/run` is that README line verbatim."""
    words = shlex.split(command.text)
    return words[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]) or words[:1] == ["pytest"]


COMMANDS = sh_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_runnable_blocks():
    assert any(module_of(shlex.split(c.text)) for c in COMMANDS)


def test_only_the_test_suite_command_is_left_to_ci():
    skipped = [c.text for c in COMMANDS if runs_the_test_suite(c)]
    assert skipped == ["python -m pytest"]
    assert not runs_the_test_suite(Command("python -m model.solve --limit-shapes 8", 1, 0))


@pytest.mark.parametrize("command", COMMANDS, ids=[f"README:{c.line}" for c in COMMANDS])
def test_every_readme_command_names_real_flags_and_files(command: Command):
    for part in re.split(r"&&|\|\||;|\|", command.text):
        words = shlex.split(part)
        found = module_of(words)
        if found is None:
            continue
        module, args = found
        serving = any(a == "serving" and b == "--cost-model" for b, a in zip(args, args[1:], strict=False))
        known = parser_flags(module, ("--cost-model", "serving") if serving else ())
        for word in args:
            flag = word.split("=", 1)[0]
            if flag.startswith("-") and not re.fullmatch(r"-\d.*", flag):
                assert flag in known, f"README line {command.line}: {module} has no flag {flag}"
            elif "/" in word and not word.startswith("-") and command.expect == 0:
                path = Path(word.rstrip("/"))
                if path.parts[0] in ("data", "scripts", "docs", "tests"):
                    assert (ROOT / path).exists() or any(ROOT.glob(str(path))), \
                        f"README line {command.line}: {word} is not in the repository"


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path: Path):
    """Every ```sh command, top to bottom, in a scratch folder holding copies of the repository's files."""
    for name in ("data", "scripts", "docs", "README.md", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name)
        elif src.exists():
            shutil.copy(src, tmp_path / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command in COMMANDS:
        if runs_the_test_suite(command):
            continue
        done = subprocess.run(["bash", "-c", command.text], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == command.expect, (
            f"README line {command.line}: `{command.text}` exited {done.returncode}, "
            f"expected {command.expect}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
