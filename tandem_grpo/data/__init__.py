"""Math problems as TRL-ready conversational prompts with a gold answer column.

Every dataset built here is a ``datasets.Dataset`` with exactly two columns:

* ``prompt``: a conversation ``[{"role": "user", "content": question + INSTRUCTION}]``, the format
  that TRL's ``GRPOTrainer`` renders with the tokenizer's chat template;
* ``answer``: the gold answer as a string (``"72"``, ``"27"``, ``"\\frac{\\pi}{2}"``). TRL passes
  it to the reward functions as the ``answer`` keyword (see [`tandem_grpo.rewards`][tandem_grpo.rewards]).

Modules, each name importable from ``tandem_grpo.data`` and documented on this page:

* [`answers`][tandem_grpo.data.answers]: gold answers in text ([`last_boxed`][tandem_grpo.data.last_boxed],
  [`stated_answer`][tandem_grpo.data.stated_answer], [`gsm8k_gold`][tandem_grpo.data.gsm8k_gold]) and the
  normalization of gold strings and numbers;
* [`instructions`][tandem_grpo.data.instructions]: what is appended to every question
  ([`INSTRUCTION`][tandem_grpo.data.INSTRUCTION], [`ONE_LINE_INSTRUCTION`][tandem_grpo.data.ONE_LINE_INSTRUCTION],
  [`INSTRUCTIONS`][tandem_grpo.data.INSTRUCTIONS]);
* [`loading`][tandem_grpo.data.loading]: files, folders, the offline mirror and the hub
  ([`load_math_dataset`][tandem_grpo.data.load_math_dataset], [`DATASETS`][tandem_grpo.data.DATASETS],
  [`to_example`][tandem_grpo.data.to_example]), with the row formats it accepts;
* [`arithmetic`][tandem_grpo.data.arithmetic]: the built-in arithmetic word problems
  ([`arithmetic_word_problems`][tandem_grpo.data.arithmetic_word_problems],
  [`arithmetic_chains`][tandem_grpo.data.arithmetic_chains], by name:
  [`BUILTIN_TASKS`][tandem_grpo.data.BUILTIN_TASKS]; training and held-out problems:
  [`builtin_split`][tandem_grpo.data.builtin_split]).
"""

from .answers import gsm8k_gold, last_boxed, stated_answer
from .arithmetic import BUILTIN_TASKS, arithmetic_chains, arithmetic_word_problems, builtin_problems, builtin_split
from .instructions import ANSWER_LINE_INSTRUCTION, INSTRUCTION, INSTRUCTIONS, ONE_LINE_INSTRUCTION, STEPS_INSTRUCTION
from .loading import DATA_DIR_ENV, DATASETS, ROW_FORMAT_HELP, ROW_FORMATS, HubDataset, load_math_dataset, to_example

__all__ = [
    "BUILTIN_TASKS",
    "DATASETS",
    "ROW_FORMATS",
    "ROW_FORMAT_HELP",
    "DATA_DIR_ENV",
    "ANSWER_LINE_INSTRUCTION",
    "INSTRUCTION",
    "INSTRUCTIONS",
    "ONE_LINE_INSTRUCTION",
    "STEPS_INSTRUCTION",
    "HubDataset",
    "arithmetic_chains",
    "arithmetic_word_problems",
    "builtin_problems",
    "builtin_split",
    "gsm8k_gold",
    "last_boxed",
    "load_math_dataset",
    "stated_answer",
    "to_example",
]
