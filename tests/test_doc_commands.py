"""The commands the docs give a reader still parse, so that a renamed flag or shape fails here, not on a GPU.

Each `python -m MODULE ...`, `python3 SCRIPT.py ...`, `pipeline ...` and kernel tool cited by its short name with
options (`bench --rounds N`) in README.md, BENCHMARKS.md, benchmarks/e2e/README.md and benchmarks/NOTES.md's
"Next GPU session" section (its "First commands" included), in inline code spans and fenced blocks alike, is
checked against today's code without running it. Fenced lines are read as the shell reads them: `\\`
continuations joined, `# comments` dropped, `&&`/`;`/`|` split, env prefixes (VATTN_HOPPER=1) and wrappers (ncu
...) set aside, and a block's own assignments (S=16x35k,...) expanded in its later lines. Checked:

- the module (or script) exists, and its own argparse parser accepts the arguments: each CLI's main(argv) builds
  its parser and parses before any work, so the test calls main(argv) with ArgumentParser.parse_args stopped
  right after parsing (a main that never reaches parse_args fails the test);
- every name given to `--shapes` of a benchmarks.kernel tool is one that benchmarks.kernel.shapes.select knows;
- every name given to `--planners` is a vattn.planner planner, and to a kernel tool's `--peers` a registered peer;
- every VATTN_* variable a command sets is one the code reads;
- every script run by `bash` or `source` exists;
- every recipes/, configs/ or tests/ path in a command exists.

What a reader fills in is skipped by these rules, and only by these:
- a placeholder is a token that is all UPPER_CASE (RECIPE, RUN_DIR, S, NAME_1), or holds a `$` (a shell
  variable: $OUT, "ef:$EF") or `<...>`: argparse still parses it (as any string), the name and path checks skip it;
- `...` elides: a command holding it is checked without its required arguments; `...` after an option is that
  option's value (any string), elsewhere it is dropped;
- an inline span with no argument after the program (or the pipeline subcommand) names the command: the program
  and subcommand must exist, nothing is required;
- an inline span may end on an option whose value follows in prose (`--shapes` with the shapes of ...): the option
  must exist, its value is not checked.
Run alone: `python -m pytest -q tests/test_doc_commands.py`.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "BENCHMARKS.md", "benchmarks/e2e/README.md", "benchmarks/NOTES.md")
NOTES_SECTION = "### Next GPU session"  # of NOTES.md only this section is a reader's to copy
OUR_PACKAGES = ("benchmarks", "vattn", "pipeline", "analysis")
SHELL_OPS = {"&&", "||", ";", "|", "(", ")", "&", ">", ">>", "<", ">&"}  # shlex's punctuation tokens
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|\$|<[^>]*>")
# the kernel tools by their short names, as prose cites them (`bench --rounds N`, `tail_plans --sustained`)
KERNEL_TOOLS = {f.stem for f in (ROOT / "benchmarks/kernel").glob("*.py") if "\ndef main(" in f.read_text()}
# programs whose arguments are another program's: only that the module exists is checked (importing it would
# need that program)
PASS_THROUGH = {"vattn.sglang.launch": "its arguments are sglang's launch_server's; importing it registers vattn "
                                       "with sglang"}
CHECKED_PATH = re.compile(r"^(?:recipes|configs|tests)/\S+")


@dataclass(frozen=True)
class Command:
    where: str  # "BENCHMARKS.md:383"
    argv: tuple[str, ...]  # from the program on, env prefixes dropped
    env: tuple[str, ...]  # the env prefixes' names: VATTN_HOPPER
    inline: bool


def doc_text(name: str) -> str:
    text = (ROOT / name).read_text()
    if name.endswith("NOTES.md"):
        start = text.index(NOTES_SECTION)
        end = text.find("\n### ", start + 1)
        # keep the line numbers: blank out what lies outside the section
        text = re.sub(r"[^\n]", "", text[:start]) + text[start:end if end > 0 else None]
    return text


def snippets(text: str):
    """(line, text, block) of each fenced block's logical line (`\\` continuations joined; block: the line its
    fence opened on) and of each inline code span (a span may wrap across lines within a paragraph; block None)."""
    lines, prose, fence = text.split("\n"), [], None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else i
            prose.append("")
        elif fence is not None:
            start = i
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + lines[i]  # as the shell joins them: inside quotes too
                prose.append("")
            yield start + 1, line, fence
            prose.append("")
        else:
            prose.append(line)
        i += 1
    body = "\n".join(prose)
    for m in re.finditer(r"(`+)(.+?)\1", body, re.S):
        if "\n\n" not in m.group(2):
            yield body.count("\n", 0, m.start()) + 1, m.group(2).replace("\n", " "), None


def _runs_ours(seg: list[str]) -> bool:
    return seg[0] in ("python", "python3") and len(seg) > 1 and (
        seg[1] == "-m" and len(seg) > 2 and seg[2].split(".")[0] in OUR_PACKAGES or seg[1].endswith(".py"))


def commands_in(tokens: list[str], variables: dict[str, str]):
    """(env prefixes, argv) of each shell segment of tokens that runs one of our programs, argv from the program on
    (after a wrapper such as `ncu ...` for python). An assignment alone (S=16x35k,...) goes into variables, and $S
    in later segments is expanded from them; other $NAMEs (loop variables, the reader's) are left as they are."""
    segment: list[str] = []
    for tok in tokens + [";"]:
        if tok not in SHELL_OPS:
            segment.append(re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: variables.get(m.group(1), m.group(0)), tok))
            continue
        env = 0
        while env < len(segment) and re.match(r"^[A-Za-z_]\w*=", segment[env]):
            env += 1  # env prefix: VATTN_HOPPER=1
        if segment and env == len(segment):
            variables.update(a.split("=", 1) for a in segment)
        elif segment[env:env + 1] == ["pipeline"]:
            yield segment[:env], segment[env:]
        elif len(segment) > env + 1 and segment[env] in ("bash", "source") and segment[env + 1].endswith(".sh"):
            yield segment[:env], segment[env:]
        elif len(segment) > env + 1 and segment[env] in KERNEL_TOOLS and segment[env + 1].startswith("--"):
            yield segment[:env], ["python", "-m", f"benchmarks.kernel.{segment[env]}", *segment[env + 1:]]
        else:
            found = next((segment[i:] for i in range(env, len(segment)) if _runs_ours(segment[i:])), None)
            if found:
                yield segment[:env], found
        segment = []


def doc_commands() -> list[Command]:
    found = []
    for doc in DOCS:
        variables: dict[int, dict[str, str]] = {}  # a fenced block's shell variables
        for line, text, block in snippets(doc_text(doc)):
            try:
                lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
                lexer.whitespace_split, lexer.commenters = True, "#"
                tokens = list(lexer)
            except ValueError:  # an unbalanced quote: prose, not a command
                continue
            segments = commands_in(tokens, {} if block is None else variables.setdefault(block, {}))
            found += [Command(f"{doc}:{line}", tuple(argv), tuple(e.split("=")[0] for e in env), block is None)
                      for env, argv in segments]
    return found


COMMANDS = doc_commands()


class _Parsed(Exception):
    pass


class _Refused(Exception):
    pass


def _program(argv: tuple[str, ...]):
    """(main, module name, args) of a command."""
    if argv[0] in ("bash", "source"):  # a shell script: that it exists is all this test checks of it
        assert (ROOT / argv[1]).is_file(), f"{argv[1]}: no such script"
        return None, argv[1], list(argv[2:])
    if argv[0] == "pipeline":
        name, args = "pipeline.cli", list(argv[1:])
    elif argv[1] == "-m":
        name, args = argv[2], list(argv[3:])
    else:
        path = ROOT / argv[1]
        assert path.is_file(), f"{argv[1]}: no such script"
        name, args = ".".join(path.relative_to(ROOT).with_suffix("").parts), list(argv[2:])
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"{name}: no such module"
    if name in PASS_THROUGH:
        return None, name, args
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        name += ".__main__"
    module = importlib.import_module(name)
    assert hasattr(module, "main"), f"{name}: no main(argv) to build its parser"
    return module.main, name, args


def _walk(parser: argparse.ArgumentParser):
    """parser and its subcommands' parsers."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _walk(sub)


def parse(main, args: list[str], *, elided: bool) -> argparse.Namespace:
    """Run main(args) up to its parse_args: the Namespace, or _Refused with argparse's message."""
    real = argparse.ArgumentParser.parse_args

    def parse_args(self, argv=None, namespace=None):
        for p in _walk(self):
            p.allow_abbrev = False  # a doc spells each option in full: `--replay` works until `--replay-s` comes
            for action in p._actions if elided else ():
                action.required = False
        raise _Parsed(real(self, argv, namespace))

    def error(self, message):
        raise _Refused(message)

    patch = pytest.MonkeyPatch()
    patch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    patch.setattr(argparse.ArgumentParser, "error", error)
    try:
        if inspect.signature(main).parameters:
            main(args)
        else:  # a main() that reads sys.argv
            patch.setattr(sys, "argv", [main.__module__, *args])
            main()
    except _Parsed as done:
        return done.args[0]
    finally:
        patch.undo()
    raise AssertionError("main(argv) returned without calling parse_args: its parser cannot be checked this way")


def _without_readers_value(message: str, args: list[str], inline: bool) -> list[str] | None:
    """args less the option argparse refused, when what it refused is the reader's to give (a placeholder value, or
    the value after an inline span's last option), else None. argparse named the option, so it exists."""
    if m := re.match(r"argument (\S+): invalid .*?: '([^']*)'", message):
        flags, value = m.group(1).split("/"), m.group(2)
        for i in range(len(args) - 1):
            if args[i] in flags and args[i + 1] == value and PLACEHOLDER.search(value):
                return args[:i] + args[i + 2:]
    if m := re.match(r"argument (\S+): expected one argument", message):
        if inline and args and args[-1] in m.group(1).split("/"):
            return args[:-1]
    return None


def check(cmd: Command) -> list[str]:
    """What is wrong with cmd, as one line a problem."""
    main, name, args = _program(cmd.argv)
    if main is None:
        return []
    elided = "..." in args or cmd.inline and len(args) <= (1 if name == "pipeline.cli" else 0)
    args = [a for i, a in enumerate(args) if a != "..." or i and args[i - 1].startswith("-")]
    ns, given = None, list(args)
    while ns is None:
        try:
            ns = parse(main, given, elided=elided)
        except _Refused as e:
            if (given := _without_readers_value(str(e), given, cmd.inline)) is None:
                return [f"{name} refuses {shlex.join(args)!r}: {e}"]
    problems = []
    shapes = getattr(ns, "shapes", None) if name.startswith("benchmarks.kernel.") else None
    if isinstance(shapes, str) and args and "--shapes" in args:
        from benchmarks.kernel.shapes import select

        for item in shapes.split(","):
            if item and not PLACEHOLDER.search(item) and "..." not in item:
                try:
                    select(item)
                except ValueError:
                    problems.append(f"--shapes: no shape or set named {item!r}")
    if isinstance(getattr(ns, "planners", None), str) and "--planners" in args:
        from vattn.planner import PLANNERS

        problems += [f"--planners: no planner named {p!r}" for p in ns.planners.split(",")
                     if p and not PLACEHOLDER.search(p) and p not in PLANNERS]
    if isinstance(getattr(ns, "peers", None), str) and "--peers" in args and name.startswith("benchmarks.kernel."):
        from benchmarks.kernel.peers.registry import PEERS

        problems += [f"--peers: no peer named {p!r}" for p in ns.peers.split(",")
                     if p and not PLACEHOLDER.search(p) and p not in PEERS]
    for arg in args:
        if CHECKED_PATH.match(arg) and not PLACEHOLDER.search(arg) and not (ROOT / arg).exists():
            problems.append(f"{arg}: no such file")
    return problems


def test_the_docs_give_commands():
    # the extraction itself still finds the commands the docs are known for
    assert len(COMMANDS) > 100, len(COMMANDS)
    programs = {" ".join(c.argv[:3] if c.argv[0] != "pipeline" else c.argv[:2]) for c in COMMANDS}
    for expected in ("python -m benchmarks.kernel.bench", "python -m benchmarks.kernel.tail_plans",
                     "python -m vattn.hopper.prebuild", "pipeline run", "pipeline sweep"):
        assert expected in programs, f"no {expected!r} command found in {DOCS}"


def test_doc_commands_set_variables_the_code_reads():
    code = "\n".join(f.read_text() for pkg in OUR_PACKAGES for f in (ROOT / pkg).rglob("*.py"))
    unread = {f"{c.where}: {v}" for c in COMMANDS for v in c.env if v.startswith("VATTN_") and f'"{v}"' not in code}
    assert not unread, f"the docs set variables no code reads: {sorted(unread)}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.where}:{' '.join(c.argv[:3])}" for c in COMMANDS])
def test_doc_command_parses(cmd: Command):
    problems = check(cmd)
    assert not problems, f"{cmd.where}: {shlex.join(cmd.argv)}\n" + "\n".join(problems)
