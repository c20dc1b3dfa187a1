"""The handoff settings are declared once (``tandem_grpo.handoff.HandoffSettings``): the training config, the rule and
both command lines (TRL's parser over ``TandemGRPOConfig``, ``tandem-grpo evaluate``) take names, defaults, help and
choices from it, and a change there reaches all of them."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env
from trl import TrlParser

from tandem_grpo import TandemGRPOConfig
from tandem_grpo.evaluation.cli import HANDOFF_HELP_SUFFIX, build_parser
from tandem_grpo.handoff import RULE_FIELDS, HandoffRule, HandoffSettings

HANDOFF_PY = Path(__file__).resolve().parents[1] / "tandem_grpo" / "handoff.py"


def _declared() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(HandoffSettings)}


def _actions(parser) -> dict:
    return {action.dest: action for action in parser._actions}


def test_every_consumer_takes_the_declaration():
    declared = _declared()
    assert set(declared) == {"handoff_mode", "handoff_granularity", "junior_probability", "max_gap_tokens"}
    config_fields = {f.name: f for f in dataclasses.fields(TandemGRPOConfig)}
    for name, field in declared.items():
        assert config_fields[name] is field, f"TandemGRPOConfig redeclares {name}; inherit it from HandoffSettings"

    rule_fields = {f.name: f for f in dataclasses.fields(HandoffRule)}
    assert set(RULE_FIELDS) == set(rule_fields) and set(RULE_FIELDS.values()) == set(declared)
    for rule_name, name in RULE_FIELDS.items():
        assert rule_fields[rule_name].default == declared[name].default, f"HandoffRule.{rule_name}'s default"
        assert rule_fields[rule_name].metadata == declared[name].metadata, f"HandoffRule.{rule_name}'s help"

    parsers = {
        "tandem-grpo evaluate": (build_parser(), HANDOFF_HELP_SUFFIX),
        "TrlParser": (TrlParser(TandemGRPOConfig), ""),
    }
    for where, (parser, suffix) in parsers.items():
        actions = _actions(parser)
        for name, field in declared.items():
            action = actions[name]
            assert f"--{name}" in action.option_strings, f"{where} lacks --{name}"
            assert action.default == field.default, f"{where}: --{name}'s default"
            assert action.help == field.metadata["help"] + suffix, f"{where}: --{name}'s help"
            assert list(action.choices or []) == list(field.metadata.get("choices", [])), f"{where}: --{name}"


def test_the_docstring_states_the_declared_defaults():
    doc = HandoffSettings.__doc__
    for name, field in _declared().items():
        stated = f'``"{field.default}"`` (default' if isinstance(field.default, str) else f"(default {field.default}"
        assert stated in doc, f"HandoffSettings' docstring does not give {name}'s default as {stated!r}"


@pytest.mark.parametrize(
    "make",
    [
        lambda: HandoffSettings(max_gap_tokens=0),
        lambda: HandoffRule(max_gap_tokens=0),
        lambda: TandemGRPOConfig(output_dir="unused", report_to=[], max_gap_tokens=0),
    ],
    ids=["HandoffSettings", "HandoffRule", "TandemGRPOConfig"],
)
def test_the_declared_checks_run_everywhere(make):
    with pytest.raises(ValueError, match=r"max_gap_tokens=0 must be an integer >= 1"):
        make()


# Run in a child process that imports tandem_grpo with handoff.py's declaration edited (a default and a help text):
# every consumer must show the edit, which fails wherever a copy of the declaration is left.
_EDITED_IMPORT = r"""
import importlib.machinery, re, sys

class Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        source = open(self.path).read()
        source, n = re.subn(r"(max_gap_tokens: int = _setting\(\s*)32,", r"\g<1>17,", source)
        assert n == 1, "max_gap_tokens' declaration changed shape: update this test's edit"
        source, n = re.subn(r'"Probability in \[0, 1\]', '"EDITED. Probability in [0, 1]', source)
        assert n == 1, "junior_probability's help changed: update this test's edit"
        return compile(source, self.path, "exec")

class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "tandem_grpo.handoff":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = Loader(name, spec.origin)
        return spec

sys.meta_path.insert(0, Finder)

from trl import TrlParser
from tandem_grpo import HandoffRule, TandemGRPOConfig
from tandem_grpo.evaluation.cli import build_parser

config = TandemGRPOConfig(output_dir="unused", report_to=[])
(parsed,) = TrlParser(TandemGRPOConfig).parse_args_into_dataclasses(["--output_dir", "unused", "--report_to", "none"])
evaluate = build_parser().parse_config(["--checkpoints", "a", "--junior", "j"])
print("config", config.max_gap_tokens, config.handoff_rule.max_gap_tokens)
print("rule", HandoffRule().max_gap_tokens)
print("trl", parsed.max_gap_tokens)
print("evaluate", evaluate.handoff.max_gap_tokens)
print("trl help", "EDITED." in TrlParser(TandemGRPOConfig).format_help())
print("evaluate help", "EDITED." in build_parser().format_help())
"""


def test_an_edit_of_the_declaration_reaches_trainer_rule_and_evaluation():
    source = HANDOFF_PY.read_text()
    assert re.search(r"max_gap_tokens: int = _setting\(\s*32,", source), "the edit below no longer applies"
    done = subprocess.run(
        [sys.executable, "-c", _EDITED_IMPORT], capture_output=True, text=True, env=child_env(), timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for expected in ("config 17 17", "rule 17", "trl 17", "evaluate 17", "trl help True", "evaluate help True"):
        assert expected in lines, f"{expected!r} not in {lines}"


def test_whether_the_junior_runs_is_decided_by_the_rule_alone():
    """One test, ``HandoffRule.sole_writer``, tells the trainer, TRL generation and the evaluation whether the junior
    runs: nobody else compares ``junior_probability`` with 0 or 1."""
    assert [HandoffRule("word", p).sole_writer for p in (0.0, 0.3, 1.0)] == ["senior", None, "junior"]
    assert HandoffRule.alone("junior").sole_writer == "junior" and HandoffRule.alone("senior").sole_writer == "senior"
    config = dict(output_dir="unused", report_to="none", use_cpu=True)
    assert TandemGRPOConfig(**config, junior_probability=0.5).co_generates
    assert TandemGRPOConfig(**config, junior_probability=1.0).co_generates  # the junior writes: co-generation
    assert not TandemGRPOConfig(**config, junior_probability=0.0).co_generates
    assert not TandemGRPOConfig(**config, junior_probability=0.5, kl_to_junior=True, beta=0.04).co_generates
    package = HANDOFF_PY.parent
    for path in (package / "trainer.py", package / "vllm" / "trl_generation.py", package / "vllm" / "evaluation.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = {getattr(n, "attr", getattr(n, "id", None)) for n in ast.walk(node)}
            assert not (isinstance(node, ast.Compare) and "junior_probability" in names), (path.name, node.lineno)
