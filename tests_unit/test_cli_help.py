"""Every `rlhf` subcommand's --help explains every option and shows one example command.

For each subparser of `rlhf.cli.build_parser()`: every option has non-empty help, the command
has a description, and its help text holds an example line starting with `rlhf <command>`,
which the parser itself accepts. `rlhf --help` and every `rlhf COMMAND --help` answer without
importing torch or transformers (a fresh process each, its modules read after the help).
"""

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from rlhf.cli import build_parser

pytestmark = pytest.mark.unit


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


NAMES = sorted(subcommands())


def test_the_parser_has_the_documented_subcommands():
    assert {"prepare", "build-embedded", "fetch-model", "sft", "judge", "ppo", "evaluate", "report", "lab"} <= set(
        NAMES
    )
    assert {"base-study", "seeds", "choose-sft-budget", "export-verl"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_option_has_help(name):
    sub = subcommands()[name]
    assert (sub.description or "").strip(), f"rlhf {name} has no description"
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        where = f"rlhf {name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help not in (None, argparse.SUPPRESS), f"{where} has no help"
        assert action.help.strip(), f"{where} has empty help"


@pytest.mark.parametrize("name", NAMES)
def test_help_shows_an_example_the_parser_accepts(name):
    text = subcommands()[name].format_help()
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith(f"rlhf {name} ")]
    assert examples, f"rlhf {name} --help shows no example line starting with 'rlhf {name} ':\n{text}"
    for line in examples:
        args = build_parser().parse_args(shlex.split(line, comments=True)[1:])
        assert args.command == name, line


def test_each_command_declares_its_options_in_one_small_function_beside_it():
    """The parser is the commands' own small adders (`add_X` beside `cmd_X` in the module of
    rlhf.cli that holds the command), put together by a short build_parser; no command's options
    live anywhere else."""
    import inspect
    import sys

    from rlhf import cli

    assert len(inspect.getsource(cli.build_parser).splitlines()) <= 30
    for name, sub in subcommands().items():
        func = sub.get_default("func")
        module = sys.modules[func.__module__]
        assert module.__name__.startswith("rlhf.cli."), f"rlhf {name}: {func.__name__} is outside rlhf.cli"
        adder = getattr(module, "add_" + func.__name__.removeprefix("cmd_"), None)
        assert adder is not None, f"rlhf {name}: no add_ function beside {func.__name__}"
        assert len(inspect.getsource(adder).splitlines()) <= 70, f"{adder.__name__} is not small"
        # beside: the adder is the next top-level function after its command
        lines = inspect.getsource(module).splitlines()
        tops = [i for i, line in enumerate(lines) if line.startswith("def ")]
        at = lines.index(f"def {func.__name__}(args) -> int:")
        following = lines[min(i for i in tops if i > at)]
        assert following.startswith(f"def {adder.__name__}("), f"{adder.__name__} is not beside {func.__name__}"


# What a help text must not wait for: torch and what comes with it (the lab's models, its numbers).
HEAVY = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "matplotlib")
HELP_PROBE = """
import json, runpy, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["rlhf", *json.loads(sys.argv[1])]
try:
    runpy.run_module("rlhf", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
print(json.dumps({"exit": code, "loaded": sorted(m for m in heavy if m in sys.modules)}))
"""


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in NAMES)], ids=" ".join)
def test_help_imports_no_torch(argv):
    """`python -m rlhf [COMMAND] --help` in a fresh process prints its help and exits 0 without
    having imported torch, transformers or anything else in HEAVY."""
    probe = subprocess.run(
        [sys.executable, "-c", HELP_PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    *help_text, last = probe.stdout.splitlines()
    assert any(line.startswith("usage: rlhf") for line in help_text), probe.stdout
    assert json.loads(last) == {"exit": 0, "loaded": []}, f"rlhf {' '.join(argv)} imported {last}"


@pytest.mark.parametrize("name", NAMES)
def test_every_default_a_help_states_is_the_one_argparse_uses(name):
    """Where an option's help says "default X" (or "(default X)"), X is the option's real default."""
    import re

    for action in subcommands()[name]._actions:
        for said in re.findall(r"default:? ([\w.-]+)", action.help or ""):
            if action.default not in (None, argparse.SUPPRESS) and not isinstance(action.default, bool):
                assert said == str(action.default), (
                    f"rlhf {name} {action.option_strings}: help says {said}, is {action.default}"
                )


def test_bare_rlhf_prints_the_commands_and_version_prints_the_package_version(capsys):
    from importlib.metadata import version

    from rlhf import __version__, cli

    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rlhf") and all(name in out for name in NAMES)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"rlhf {__version__}"
    assert __version__ == version("rlhf")
