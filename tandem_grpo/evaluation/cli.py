"""``tandem-grpo evaluate``: the options parsed into an
[`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig] and run by
[`evaluate`][tandem_grpo.evaluation.runner.evaluate].

Example (two benchmarks with the paper authors' decoding, 50 problems of each):

    tandem-grpo evaluate --checkpoints HuggingFaceTB/SmolLM2-135M-Instruct \\
        --junior HuggingFaceTB/SmolLM2-135M-Instruct --dataset gsm8k math500 --split test --limit 50 \\
        --preset paper --output_dir results/smollm2-paper
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from transformers import HfArgumentParser

from ..handoff import HandoffSettings
from ..sampling import SamplingSettings
from .runner import MEASUREMENTS, EvaluationConfig, EvaluationError, evaluate

PROG = "tandem-grpo evaluate"

SAMPLING_HELP = {
    "temperature": "Softmax temperature, > 0 (the command always samples). The sampling defaults are the paper's "
    "evaluation decoding (temperature 0.7, top_p 0.8, top_k 20, as --preset paper); --temperature 1 --top_p 1 "
    "--top_k 0 samples each model's whole distribution.",
    "top_p": "Nucleus mass kept, in (0, 1]; 1 turns it off.",
    "top_k": "Most likely tokens kept, >= 0; 0 turns it off.",
    "min_p": "Tokens less likely than min_p times the most likely one are dropped, in [0, 1]; 0 turns it off.",
    "repetition_penalty": "Repetition penalty, > 0; 1 turns it off.",
}
"""``--help`` texts of the [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] flags (the class carries no
field metadata); their defaults are [`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig]'s, the
paper's evaluation decoding."""

HANDOFF_HELP_SUFFIX = " Here: the rule of the training-rule schedule (--schedules word)."
"""Appended to the help of each [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings] flag, whose text is the
training config's."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: ...)`` unless the default is ``None`` (the help then says what happens instead)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or isinstance(action.default, bool):
            return action.help or ""
        return super()._get_help_string(action)


class EvaluateParser(HfArgumentParser):
    """``HfArgumentParser`` over [`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig],
    [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings] and
    [`HandoffSettings`][tandem_grpo.handoff.HandoffSettings]: one flag per field, named as the field, help from the
    field's metadata, defaults from the dataclass.

    Beyond a plain ``HfArgumentParser``: the nested ``sampling`` and ``handoff`` fields are flags of their own
    fields (the rule's under the training config's names, declared once in ``HandoffSettings``);
    ``--skip MEASUREMENT ...`` and ``--no_progress``; and
    [`error`][tandem_grpo.evaluation.cli.EvaluateParser.error] raises
    [`EvaluationError`][tandem_grpo.evaluation.config.EvaluationError], so every usage error is one ``error:`` line.
    """

    def __init__(self, prog: str = PROG) -> None:
        super().__init__(
            (EvaluationConfig, SamplingSettings, HandoffSettings),
            prog=prog,
            allow_abbrev=False,  # a shortened flag is refused, as in the example scripts (tandem_grpo.script_parser)
            formatter_class=_HelpFormatter,
            description="Measure solo capability (pass@k, its curve and coverage), handoff robustness, distribution "
            "drift and legibility to the junior (Tandem RL, arXiv 2606.28166, section 5) and write results.json, "
            "plots and an authorship view.",
        )
        handoff_flags = {f.name for f in dataclasses.fields(HandoffSettings)}
        for action in self._actions:
            if action.dest in SAMPLING_HELP:
                action.help = SAMPLING_HELP[action.dest]
            elif action.dest in handoff_flags:
                action.help += HANDOFF_HELP_SUFFIX
            elif action.dest == "show_progress":  # HfArgumentParser makes two flags; --no_progress is the one shown
                action.help = argparse.SUPPRESS
        # The flags come from SamplingSettings, whose defaults are TRL's (temperature 1): the evaluation's are the
        # paper's evaluation decoding, EvaluationConfig's.
        self.set_defaults(**dataclasses.asdict(EvaluationConfig(checkpoints=[]).sampling))
        self.add_argument("--skip", nargs="+", default=[], choices=MEASUREMENTS, help="Measurements to leave out.")
        self.add_argument("--no_progress", dest="show_progress", action="store_false", help="Hide progress bars.")

    @staticmethod
    def _parse_dataclass_field(parser, field: dataclasses.Field) -> None:
        # EvaluationConfig.sampling and .handoff: parsed as SamplingSettings' and HandoffSettings' own flags.
        if dataclasses.is_dataclass(field.type):
            return
        HfArgumentParser._parse_dataclass_field(parser, field)

    def error(self, message: str):
        """Raise [`EvaluationError`][tandem_grpo.evaluation.config.EvaluationError] with argparse's ``message``
        (a missing, unknown or malformed flag)."""
        raise EvaluationError(f"{message} (see --help)")

    def given_flags(self, argv: list[str]) -> set[str]:
        """The destinations (field names) of the flags that appear in ``argv``, as ``--flag value`` or
        ``--flag=value`` (any of a flag's spellings; abbreviations are refused by the parser)."""
        options = {option: action.dest for action in self._actions for option in action.option_strings}
        given = set()
        for token in argv:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if name in options:
                given.add(options[name])
        return given

    def parse_config(self, argv: list[str] | None = None) -> EvaluationConfig:
        """Parse ``argv`` (default: ``sys.argv[1:]``) into the run's
        [`EvaluationConfig`][tandem_grpo.evaluation.config.EvaluationConfig], with ``--preset`` applied: the
        flags given in ``argv`` win over the preset's values
        ([`apply_preset`][tandem_grpo.evaluation.config.EvaluationConfig.apply_preset]).

        Raises:
            EvaluationError: a missing, unknown or malformed flag, an unknown preset, or invalid sampling settings
                (named). The other values are checked when the run starts, by
                [`EvaluationConfig.validate`][tandem_grpo.evaluation.config.EvaluationConfig.validate].
        """
        argv = sys.argv[1:] if argv is None else list(argv)
        values = vars(self.parse_args(argv))
        skip = values.pop("skip")
        try:
            sampling = SamplingSettings(**{f.name: values.pop(f.name) for f in dataclasses.fields(SamplingSettings)})
            settings = HandoffSettings(**{f.name: values.pop(f.name) for f in dataclasses.fields(HandoffSettings)})
            handoff = settings.handoff_rule
        except ValueError as err:
            raise EvaluationError(f"--{err}") from err
        config = EvaluationConfig(**values, sampling=sampling, handoff=handoff)
        config.measurements = [m for m in config.measurements if m not in skip]
        config.apply_preset(given=self.given_flags(argv))
        return config


def build_parser(prog: str = PROG) -> EvaluateParser:
    """The argument parser of ``tandem-grpo evaluate`` (see
    [`EvaluateParser`][tandem_grpo.evaluation.cli.EvaluateParser])."""
    return EvaluateParser(prog)


def main(argv: list[str] | None = None) -> int:
    """Run ``tandem-grpo evaluate`` with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 2 on a usage error (a bad, missing or unknown flag, or a bad value found before or while
        loading data and models), printed as one ``tandem-grpo evaluate: error: ...`` line on stderr, no traceback.
        ``--help`` prints the options and exits 0 (``SystemExit``).
    """
    parser = build_parser()
    try:
        config = parser.parse_config(argv)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        results = evaluate(config)
    except EvaluationError as err:
        message = " ".join(str(err).split())
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2
    print(_summary(results))
    return 0


def _passes(block: dict, ks: list[int]) -> str:
    return ", ".join(f"pass@{k} {block[f'pass@{k}']['value']:.3f}" for k in ks)


def _benchmark_lines(block: dict, ks: list[int], indent: str) -> list[str]:
    """With several benchmarks: the macro average of ``block``'s pass@k and one line per benchmark (nothing for one
    benchmark, or for results without ``by_benchmark``)."""
    by_benchmark = block.get("by_benchmark") or {}
    if len(by_benchmark) < 2:
        return []
    lines = [f"{indent}macro over {len(by_benchmark)} benchmarks: {_passes(block['macro'], ks)}"]
    for bench, figures in by_benchmark.items():
        n = figures["pass@1"]["num_problems"]
        lines.append(f"{indent}  {bench} ({n} problem{'s' * (n != 1)}): {_passes(figures, ks)}")
    return lines


def _summary(results: dict) -> str:
    ks = results["settings"]["pass_at"]
    lines = [f"Results in {results['outputs'].get('results')} ({results['timing_seconds']['total']:.0f} s)"]
    settings, sampling = results["settings"], results["settings"]["sampling"]
    preset = f"Preset {settings['preset']}: " if settings.get("preset") else "Sampled at "
    lines.append(
        f"{preset}temperature {sampling['temperature']:g}, top_p {sampling['top_p']:g}, top_k {sampling['top_k']}, "
        f"k {settings['k']}, max_new_tokens {settings['max_new_tokens']}"
    )
    for name, entry in results["checkpoints"].items():
        solo = _passes(entry["solo"], ks)
        curve = entry["solo"]["pass_at_k_curve"]
        solo += f", coverage {curve['coverage']['value']:.3f} (any of {curve['num_samples']} samples correct)"
        lines.append(f"{name}: solo {solo}")
        lines += _benchmark_lines(entry["solo"], ks, "  ")
        for sched, h in entry.get("handoff", {}).items():
            line = f"  {sched}: pass@{ks[-1]} {h[f'pass@{ks[-1]}']['value']:.3f}"
            if len(h.get("by_benchmark") or {}) > 1:
                line += f" (macro {h['macro'][f'pass@{ks[-1]}']['value']:.3f})"
            lines.append(line)
            lines += _benchmark_lines(h, ks, "    ")
        if "drift_with_null" in entry:
            # The excess leads: the raw KL between halves of finite samples is > 0 even for the base itself.
            drift = entry["drift_with_null"]
            excess = drift["excess_nats"]
            line = (f"  drift from base: excess over its null {excess['value']:.4f} nats [{excess['ci_low']:.4f}, "
                    f"{excess['ci_high']:.4f}] (KL {drift['kl_nats']['value']:.4f} minus the base's own halves' "
                    f"{drift['null_kl_nats']['value']:.4f})")  # fmt: skip
            part = drift.get("by_position")
            if part:
                line += (f" (first {part['prefix_tokens']} tokens {part['first']['excess_nats']['value']:.4f}, "
                         f"rest {part['rest']['excess_nats']['value']:.4f})")  # fmt: skip
            lines.append(line)
        if "legibility" in entry:
            leg = entry["legibility"]
            ov = "n/a" if leg["overlap"] is None else f"{leg['overlap']:.3f}"
            lines.append(f"  junior cross-entropy {leg['junior_cross_entropy']:.3f} nats/token, overlap {ov}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
