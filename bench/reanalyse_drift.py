"""Re-measure drift and the moved-back share of a finished evaluation from its ``samples.jsonl``, with nulls and
intervals ([`tandem_grpo.evaluation.drift`][tandem_grpo.evaluation.drift]), and the reward-hacking detectors of every
model's solo samples ([`tandem_grpo.evaluation.hacks`][tandem_grpo.evaluation.hacks]).

The samples hold decoded text, so completions are re-tokenized (special tokens were skipped when they were
written, so EOS is not counted; the cap rate counts a completion as capped when its recorded token count reached
the run's ``max_new_tokens``). Usage::

    python bench/reanalyse_drift.py results/cpu-small/seed-1 --base HuggingFaceTB/SmolLM2-135M-Instruct \
        --grpo outputs/reproduce-cpu-small/seed-1/grpo

writes ``drift_reanalysis.json`` next to the samples and prints a table.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer

from tandem_grpo.evaluation.drift import drift, moved_back
from tandem_grpo.evaluation.hacks import hack_detectors
from tandem_grpo.models import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="an evaluation's output folder (holds samples.jsonl)")
    parser.add_argument(
        "--base", required=True, help="the base's checkpoint name in samples.jsonl (also its tokenizer)"
    )
    parser.add_argument("--grpo", required=True, help="the GRPO checkpoint's name in samples.jsonl")
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()

    folder = Path(args.folder)
    rows = [json.loads(line) for line in (folder / "samples.jsonl").open(encoding="utf-8")]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.base))
    grouped: dict[str, dict[int, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    records: dict[str, dict[int, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r["schedule"] == "solo":
            ids = tokenizer(r["text"], add_special_tokens=False)["input_ids"]
            grouped[r["checkpoint"]][r["problem"]][r["sample"]] = ids
            records[r["checkpoint"]][r["problem"]][r["sample"]] = r
    results_file = folder / "results.json"
    cap = json.loads(results_file.read_text())["settings"]["max_new_tokens"] if results_file.is_file() else None
    for name in (args.base, args.grpo):
        if name not in grouped:
            raise SystemExit(
                f"error: no solo samples of {name!r} in {folder / 'samples.jsonl'}; found {list(grouped)}"
            )

    def as_lists(name: str) -> list[list[list[int]]]:
        by_problem = grouped[name]
        return [[by_problem[p][s] for s in sorted(by_problem[p])] for p in sorted(by_problem)]

    base, grpo = as_lists(args.base), as_lists(args.grpo)
    vocab = len(tokenizer)
    out: dict = {"source": str(folder / "samples.jsonl"), "base": args.base, "grpo": args.grpo, "checkpoints": {}}
    if cap is not None:
        out["hacks"] = {}
        for name in grouped:
            by_problem = records[name]
            recs = [[by_problem[p][s] for s in sorted(by_problem[p])] for p in sorted(by_problem)]
            # The recorded length (EOS included when generated) decides capping: padded with EOS-free filler ids, a
            # completion that reached the cap counts as capped, one that stopped earlier does not.
            lengths = [[[-1] * min(r["num_tokens"], cap) for r in g] for g in recs]
            texts = [[r["text"] for r in g] for g in recs]
            out["hacks"][name] = hack_detectors(as_lists(name), texts, cap, [], seed=0) | {
                "cap_rate": hack_detectors(lengths, texts, cap, [], seed=0)["cap_rate"],
                "num_tokens_source": "re-tokenized text (EOS not counted)",
            }
    print(f"{'checkpoint':<40} {'drift excess (nats)':>28} {'moved back':>10} {'null':>6} {'excess':>22}")
    for name in grouped:
        if name == args.base:
            continue
        model = as_lists(name)
        entry = {"drift": drift(model, base, prefix_tokens=8, num_resamples=args.resamples)}
        if name != args.grpo:
            entry["moved_back"] = moved_back(base, grpo, model, vocab, num_resamples=args.resamples)
        out["checkpoints"][name] = entry
        d = entry["drift"]["excess_nats"]
        cell = f"{d['value']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"
        mb = entry.get("moved_back")
        back = (
            f"{mb['fraction_moved_back']['value']:>10.3f} {mb['null_fraction']['value']:>6.3f} "
            f"{mb['excess']['value']:.3f} [{mb['excess']['ci_low']:.3f}, {mb['excess']['ci_high']:.3f}]"
            if mb
            else ""
        )
        print(f"{Path(name).name:<40} {cell:>28} {back}")
    path = folder / "drift_reanalysis.json"
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
