"""The comparison table: one row per claim and metric, each arm's value with its interval (and null), and the
paired differences between arms.

A comparison row (one seed, from ``comparison_rows``, which lists
every row and its source) is ``{"claim", "metric", "kind", "source", "arms"}``: ``kind`` ``"per_problem"`` (each arm a
list of per-problem values, one per problem, in the evaluation's problem order), ``"estimate"`` (each arm the
evaluation's own figure with its interval, and its null where it has one: ``{"value", "ci_low", "ci_high"[, "null"]}``)
or ``"scalar"`` (each arm one pooled number, no interval: the earlier estimators); ``source`` names the results.json
keys it was read from; ``arms`` maps ``"base"`` and each arm to its value, None where the measurement does not apply,
or ``NOT_MEASURED`` where the results lack it (e.g. a results.json written before the nulls and intervals). A table
row (from ``comparison_table``) replaces the values by estimates
"""

from __future__ import annotations

import html

from tandem_grpo.evaluation.stats import bootstrap_mean, pass_at_k

from .plan import ARMS, LABELS

DIFFERENCES = (("tandem", "grpo"), ("kl_to_junior", "grpo"))
"""The paired differences ``(a, b)`` reported as ``"a - b"``."""

NOT_MEASURED = "not measured"
"""A row's value for an arm whose evaluation results lack the figure (an earlier results.json, a measurement or
schedule that was not run, too few samples for a null); shown as such in the tables."""

HACK_ROWS = (
    ("repeated_4gram_share", "repeated 4-gram share of the solo completions"),
    ("boxed_share", "share of the solo text inside \\boxed{}"),
    ("cap_rate", "share of solo completions cut at the token cap"),
)
"""The reward-hacking rows: the key in the solo block's ``hacks``
([`hack_detectors`][tandem_grpo.evaluation.hacks.hack_detectors]) and the row's metric."""

INTERVALS = (
    "pass@k, accuracy and pass@k-curve rows: percentile bootstrap over problems of per-problem values rebuilt from "
    "the evaluation's correct counts, differences paired per problem; the differences of pass@k, accuracy and "
    "coverage have a permutation null (the same difference between two random halves of both arms' pooled samples "
    "of each problem, 2000 splits; pooled over seeds, every seed's problems split together). Senior share and "
    "reward-hacking rows: the evaluation's percentile bootstrap over problems. Drift, moved-back and legibility "
    "rows: the evaluation's normal intervals with a bootstrap standard error over problems, each with its null "
    "(drift: the base's two halves; moved back: GRPO's own samples; legibility: even minus odd samples). "
    "Differences of the drift and "
    "junior cross-entropy rows between arms of one seed: the same bootstrap over problems applied to both arms "
    "(paired), computed from the pieces' samples; other differences of those rows, and any pooled over seeds, are "
    "differences of values without an interval. Rows marked "
    "'earlier estimator'/'earlier figure' are pooled over tokens, without interval or null. 'not measured': the "
    "evaluation's results lack the figure; '—': it does not apply (base = the self-paired junior)."
)
"""What the comparison's intervals are, as the report states it (also ``results.json``'s ``comparison.intervals``)."""


# ------------------------------------------------------------------------------------------------- comparison


def _estimate(values: list[float], confidence: float, seed: int) -> dict:
    e = bootstrap_mean(values, confidence, seed=seed)
    return {"value": e.value, "ci_low": e.low, "ci_high": e.high}


def _number(value) -> float | None:
    """A figure read from results: NaN (in memory) and None (NaN as written to JSON) both become None."""
    return None if value is None or value != value else float(value)


def _interval(estimate: dict | None, null: dict | None = None) -> dict | str:
    """An interval dict of the evaluation (``value``, ``ci_low``, ``ci_high``, ...) as a comparison estimate
    ``{"value", "ci_low", "ci_high"}`` (NaN as None), with the null's estimate under ``"null"`` when given;
    ``NOT_MEASURED`` when ``estimate`` is missing."""
    if not isinstance(estimate, dict):
        return NOT_MEASURED
    out = {key: _number(estimate.get(key)) for key in ("value", "ci_low", "ci_high")}
    if isinstance(null, dict):
        out["null"] = {key: _number(null.get(key)) for key in ("value", "ci_low", "ci_high")}
    return out


def _path(block, *keys):
    """``block[k1][k2]...``, or None where a level is missing (an earlier results.json lacks the newer keys)."""
    for key in keys:
        if not isinstance(block, dict):
            return None
        block = block.get(key)
    return block


def _row(claim: str, metric: str, kind: str, arms: dict, source: str) -> dict:
    """One comparison row of one seed: ``kind`` ``"per_problem"`` (each arm: a list), ``"scalar"`` (a number) or
    ``"estimate"`` (an interval dict); ``source`` names where in the evaluation's results.json it was read."""
    return {"claim": claim, "metric": metric, "kind": kind, "source": source, "arms": {"base": None, **arms}}


def _schedule_label(schedule: str) -> str:
    if schedule == "alternating":
        return "alternating (paper's protocol)"
    if schedule.startswith("word"):
        return f"{schedule} (training rule)"
    return schedule


def comparison_rows(results: dict, arm_paths: dict[str, str], paired: dict[str, dict] | None = None) -> list[dict]:
    """The comparison's rows for one seed, read from one evaluation's results.

    Each arm's value is per-problem values (intervals and paired differences are computed from them), one pooled
    number (``scalar``, no interval), the evaluation's own estimate with its interval and null (``estimate``), None
    where the measurement does not apply (the base in a handoff row, GRPO in the moved-back row), or
    ``NOT_MEASURED`` where the results do not hold it (an earlier results.json, a measurement or schedule that was
    not run, ``k`` too small for a null). The headline rows are always there, measured or not, so the tables of
    every seed have the same rows.

    The rows, in the report's order (``<arm>`` is ``checkpoints[<arm's path>]``; the base is the junior, self-paired,
    read from ``junior``):

    - solo capability: ``pass@k`` for every ``k`` of ``settings.pass_at`` and the mean accuracy; per-problem values
      rebuilt from ``<arm>.solo.correct_per_problem`` with the evaluation's unbiased estimator
      (``tandem_grpo.evaluation.stats.pass_at_k``), so an arm's interval equals the evaluation's
      (same bootstrap, same seed) and differences are paired per problem.
    - handoff robustness, per schedule of ``<arm>.handoff`` (``alternating`` first, always: the paper's protocol,
      senior first, one reasoning step each; then the training rule ``word_p<p>`` and the step schedules):
      pass@k for the smallest and largest ``k`` (per problem, as above) and the senior's share of the tokens
      (``<arm>.handoff.<schedule>.senior_share``, estimate).
    - drift: the excess of the binned-KL drift from the base over the base's own two halves (the null), whole and
      for the first ``N`` completion tokens and the rest (``<arm>.drift_with_null.excess_nats``, null
      ``null_kl_nats``; ``by_position``); the moved-back share of GRPO's most-shifted tokens in excess of its null
      (``<arm>.moved_back.excess``, null ``null_fraction``). Then the earlier estimator, without null or interval
      (only when some arm has it): smoothed KL(model || base) whole and by position (``<arm>.drift``, base 0 by
      definition) and the share moved back (``<arm>.drift_reversal.fraction_moved_back``).
    - legibility: the junior's cross-entropy averaged as the authors do (per completion without EOS, then over
      completions; ``<arm>.legibility.junior_cross_entropy_with_null.mean``, null ``null_half_difference``: even
      minus odd samples; base: ``junior.legibility_self``), its paired difference from the junior on its own
      samples (``<arm>.legibility.minus_junior_self.junior_cross_entropy``), the senior/junior overlap
      (``overlap_with_null``); then, when some arm has legibility, the earlier pooled figures (token-weighted, EOS
      included: ``junior_cross_entropy_pooled``/``overlap_pooled``, which results written before the authors'
      averaging hold under ``junior_cross_entropy``/``overlap``).
    - reward hacking: repeated 4-gram share, share of the text inside ``\\boxed{}`` and cap rate of the solo
      completions (``<arm>.solo.hacks``, estimates; base: ``junior.solo.hacks``).
    - pass@k curve: coverage (any of the curve's ``n`` samples correct) and the mean of pass@k over k = 1..n, per
      problem from ``correct_per_problem``.

    Args:
        results: one evaluation's results (``tandem_grpo.evaluation.evaluate``'s return value, or its
            ``results.json``): ``settings.pass_at``, ``junior`` and ``checkpoints`` keyed by checkpoint path.
        arm_paths: each arm of ``ARMS`` to its checkpoint path as the evaluation names it.
        paired: differences between arms with a paired interval, computed outside one evaluation (the study's report
            computes them from the pieces' samples): the figure's path in an arm's entry (``"drift_with_null"``,
            ``"drift_with_null.by_position.first"``, ``"legibility.junior_cross_entropy_with_null"``...) to
            ``{"<a> - <b>": interval dict}``; those rows carry them as ``paired_differences``.

    Returns:
        The rows (see the module docstring for their shape; each also names its ``source``).

    Raises:
        KeyError: a results dict without ``checkpoints`` or ``settings.pass_at``.
        StopIteration: no solo block at all (nothing to compare).
    """
    entries = {arm: results["checkpoints"].get(path) or {} for arm, path in arm_paths.items()}
    junior = results.get("junior") or {}
    solo = {"base": junior.get("solo")} | {arm: entries[arm].get("solo") for arm in ARMS}
    ks = results["settings"]["pass_at"]
    rows: list[dict] = []

    def per_problem(block: dict | None, fn) -> list[float] | str:
        if not block or "correct_per_problem" not in block:
            return NOT_MEASURED
        return [fn(block["num_samples"], c) for c in block["correct_per_problem"]]

    def with_counts(row: dict, blocks: dict[str, dict | None], k: int) -> dict:
        """The row of a pass@k of correct counts, with the counts its differences' permutation null splits."""
        row["null_k"] = k
        row["counts"] = {arm: (b["correct_per_problem"], b["num_samples"]) if b and "correct_per_problem" in b
                         else None for arm, b in blocks.items()}  # fmt: skip
        return row

    def solo_row(claim: str, metric: str, fn, source: str, k: int | None = None) -> dict:
        row = _row(claim, metric, "per_problem", {a: per_problem(b, fn) for a, b in solo.items()}, source)
        return row if k is None else with_counts(row, solo, k)

    def estimate_row(claim: str, metric: str, source: str, read, base=None, arms=ARMS, key=None) -> None:
        values = {arm: _interval(*read(entries[arm])) if arm in arms else None for arm in ARMS}
        rows.append(_row(claim, metric, "estimate", values | {"base": base}, source))
        if key in (paired or {}):
            rows[-1]["paired_differences"] = paired[key]

    # Solo capability.
    for k in ks:
        fn = lambda n, c, k=k: pass_at_k(n, c, k)  # noqa: E731
        rows.append(solo_row("solo capability", f"pass@{k}", fn, "<arm>.solo.correct_per_problem", k))
    rows.append(solo_row("solo capability", "mean accuracy", lambda n, c: c / n, "<arm>.solo.correct_per_problem", 1))

    # Handoff robustness: the paper's protocol first, always; then every schedule the evaluation ran.
    found = dict.fromkeys(s for arm in ARMS for s in (entries[arm].get("handoff") or {}))
    schedules = ["alternating", *(s for s in found if s != "alternating")]
    if not any(s.startswith("word") for s in schedules):
        schedules.insert(1, "word")
    for schedule in schedules:
        label = _schedule_label(schedule)
        source = f"<arm>.handoff.{schedule}"
        for k in dict.fromkeys((ks[0], ks[-1])):
            fn = lambda n, c, k=k: pass_at_k(n, c, k)  # noqa: E731
            blocks = {arm: _path(entries[arm], "handoff", schedule) for arm in ARMS}
            arms = {arm: per_problem(block, fn) for arm, block in blocks.items()}
            row = _row("handoff robustness", f"{label} pass@{k}", "per_problem", arms, f"{source}.correct_per_problem")
            rows.append(with_counts(row, blocks, k))
        estimate_row("handoff robustness", f"{label} senior share of tokens", f"{source}.senior_share",
                     lambda e, s=schedule: (_path(e, "handoff", s, "senior_share"),))  # fmt: skip

    # Drift: excess over the base's own halves, whole and by position, and the moved-back excess.
    with_null = [_path(entries[arm], "drift_with_null") for arm in ARMS]
    prefix = next((_path(d, "by_position", "prefix_tokens") for d in with_null if _path(d, "by_position")), None)
    if prefix is None:
        prefix = next((_path(e, "drift", "by_position", "prefix_tokens") for e in entries.values() if e), None)
    if prefix is None:
        prefix = results["settings"].get("drift_prefix_tokens")
    parts = [((), "whole completion")]
    if prefix is not None:
        parts += [(("by_position", "first"), f"first {prefix} tokens"),
                  (("by_position", "rest"), f"after token {prefix}")]  # fmt: skip
    for keys, where in parts:
        block = ("drift_with_null", *keys)
        estimate_row(
            "drift", f"excess drift from base over null (binned KL, nats), {where}",
            f"<arm>.{'.'.join(block)}.excess_nats (null: null_kl_nats)",
            lambda e, b=block: (_path(e, *b, "excess_nats"), _path(e, *b, "null_kl_nats")), key=".".join(block),
        )  # fmt: skip
    estimate_row(
        "drift", "share of GRPO's most-shifted tokens moved back, excess over null",
        "<arm>.moved_back.excess (null: null_fraction)",
        lambda e: (_path(e, "moved_back", "excess"), _path(e, "moved_back", "null_fraction")),
        arms=[arm for arm in ARMS if arm != "grpo"],
    )  # fmt: skip
    if any(e.get("drift") for e in entries.values()):
        old = [((), "whole completion")]
        if prefix is not None:
            old += [(("by_position", "first"), f"first {prefix} tokens"),
                    (("by_position", "rest"), f"after token {prefix}")]  # fmt: skip
        for keys, where in old:
            kl = {arm: _scalar(_path(entries[arm], "drift"), *keys, "kl_to_base_nats") for arm in ARMS}
            rows.append(_row("drift", f"smoothed KL(model || base), nats, {where} (earlier estimator, no null)",
                             "scalar", kl | {"base": 0.0},
                             f"<arm>.drift.{'.'.join((*keys, 'kl_to_base_nats'))}"))  # fmt: skip
        moved = {arm: None if arm == "grpo" else _scalar(_path(entries[arm], "drift_reversal"), "fraction_moved_back")
                 for arm in ARMS}  # fmt: skip
        rows.append(_row("drift", "share of GRPO's most-shifted tokens moved back (earlier estimator, no null)",
                         "scalar", moved, "<arm>.drift_reversal.fraction_moved_back"))  # fmt: skip

    # Legibility: the authors' averaging with its null, the paired difference from the junior, the earlier figures.
    own = junior.get("legibility_self")
    ce = ("legibility", "junior_cross_entropy_with_null")
    estimate_row(
        "legibility", "junior cross-entropy, nats/token (authors' averaging)",
        "<arm>.legibility.junior_cross_entropy_with_null.mean (null: null_half_difference); base: "
        "junior.legibility_self",
        lambda e: (_path(e, *ce, "mean"), _path(e, *ce, "null_half_difference")),
        base=_interval(_path(own, ce[1], "mean"), _path(own, ce[1], "null_half_difference")), key=".".join(ce),
    )  # fmt: skip
    estimate_row(
        "legibility", "junior cross-entropy minus the junior's on its own samples, nats/token (paired)",
        "<arm>.legibility.minus_junior_self.junior_cross_entropy",
        lambda e: (_path(e, "legibility", "minus_junior_self", "junior_cross_entropy"),),
    )  # fmt: skip
    ov = ("legibility", "overlap_with_null")
    estimate_row(
        "legibility", "senior/junior distribution overlap (authors' averaging)",
        "<arm>.legibility.overlap_with_null.mean (null: null_half_difference)",
        lambda e: (_path(e, *ov, "mean"), _path(e, *ov, "null_half_difference")),
    )  # fmt: skip
    if any(e.get("legibility") for e in entries.values()):
        pooled_ce = {arm: _pooled(entries[arm].get("legibility"), "junior_cross_entropy") for arm in ARMS}
        pooled_ce["base"] = _pooled(own, "junior_cross_entropy")
        rows.append(_row("legibility", "junior cross-entropy, nats/token, pooled over tokens (earlier figure)",
                         "scalar", pooled_ce, "<arm>.legibility.junior_cross_entropy_pooled (earlier results: "
                         "junior_cross_entropy); base: junior.legibility_self"))  # fmt: skip
        pooled_ov = {arm: _pooled(entries[arm].get("legibility"), "overlap") for arm in ARMS}
        rows.append(_row("legibility", "senior/junior overlap, pooled over tokens (earlier figure)", "scalar",
                         pooled_ov, "<arm>.legibility.overlap_pooled (earlier results: overlap)"))  # fmt: skip

    # Reward hacking: the solo completions' detectors.
    for name, metric in HACK_ROWS:
        estimate_row(
            "reward hacking", metric, f"<arm>.solo.hacks.{name}; base: junior.solo.hacks",
            lambda e, n=name: (_path(e, "solo", "hacks", n),),
            base=_interval(_path(junior, "solo", "hacks", name)),
        )  # fmt: skip

    # The pass@k curve.
    last = next(
        (_path(b, "pass_at_k_curve", "k") or [b["num_samples"]])[-1] for b in solo.values() if isinstance(b, dict)
    )
    coverage = solo_row("pass@k curve", f"coverage (any of {last} samples correct)", lambda n, c: float(c > 0),
                        "<arm>.solo.correct_per_problem")  # fmt: skip
    n = {b["num_samples"] for b in solo.values() if isinstance(b, dict) and "num_samples" in b}
    rows.append(with_counts(coverage, solo, n.pop()) if len(n) == 1 else coverage)  # coverage = pass@n
    area = lambda n, c: sum(pass_at_k(n, c, j) for j in range(1, last + 1)) / last  # noqa: E731
    rows.append(solo_row("pass@k curve", f"mean of pass@k over k = 1..{last}", area, "<arm>.solo.correct_per_problem"))
    return rows


def _scalar(block, *keys) -> float | str | None:
    """A pooled number of the results: ``NOT_MEASURED`` without the block, None where it holds no value (NaN)."""
    if not isinstance(block, dict):
        return NOT_MEASURED
    return _number(_path(block, *keys))


def _pooled(block: dict | None, name: str) -> float | str | None:
    """The token-pooled legibility figure ``name`` (``junior_cross_entropy`` or ``overlap``): ``<name>_pooled``, or
    in results written before the authors' averaging (no ``<name>_with_null``) the figure under ``<name>``."""
    if not isinstance(block, dict):
        return NOT_MEASURED
    if f"{name}_pooled" in block:
        return _number(block[f"{name}_pooled"])
    if f"{name}_with_null" not in block and name in block:
        return _number(block[name])
    return NOT_MEASURED


def _not_measured() -> dict:
    return {"value": None, "ci_low": None, "ci_high": None, "note": NOT_MEASURED}


def _pool(kind: str, values: list, confidence: float, seed: int) -> tuple[object, dict | None, list | None]:
    """One arm of one table row from its per-seed values: ``(pooled value, table entry, seed range)``."""
    if any(v is None for v in values):
        return None, None, None
    if any(isinstance(v, str) for v in values):  # NOT_MEASURED in some seed
        return NOT_MEASURED, _not_measured(), None
    if kind == "per_problem":
        pooled = [sum(col) / len(col) for col in zip(*values, strict=True)]
        return pooled, _estimate(pooled, confidence, seed), None
    if kind == "scalar":
        if len(values) == 1:
            return values[0], {"value": values[0], "ci_low": None, "ci_high": None}, None
        pooled = sum(values) / len(values)
        return pooled, {"value": pooled, "ci_low": None, "ci_high": None}, [min(values), max(values)]
    # An estimate: one seed keeps the evaluation's interval; several are averaged, without an interval.
    if len(values) == 1:
        return values[0]["value"], dict(values[0]), None
    points = [v["value"] for v in values]
    if any(p is None for p in points):
        return None, {"value": None, "ci_low": None, "ci_high": None}, None
    pooled = sum(points) / len(points)
    entry = {"value": pooled, "ci_low": None, "ci_high": None}
    nulls = [_path(v, "null", "value") for v in values]
    if all(n is not None for n in nulls):
        entry["null"] = {"value": sum(nulls) / len(nulls), "ci_low": None, "ci_high": None}
    return pooled, entry, [min(points), max(points)]


def _pass_at_k_null(rows: tuple[dict, ...], a: str, b: str, confidence: float, seed: int) -> dict | None:
    """The permutation null ([`permutation_null`][tandem_grpo.evaluation.solo.permutation_null]) of a pass@k row's
    difference ``a - b``, over the problems of every seed (pooled over seeds, the difference is the mean over seeds
    and problems, so the problems of all seeds are split together); None where the row is not a pass@k of correct
    counts, or some seed lacks them or samples another number per problem."""
    from tandem_grpo.evaluation.solo import permutation_null

    counts = [(row.get("counts") or {}).get(arm) for row in rows for arm in (a, b)]
    if "null_k" not in rows[0] or any(c is None for c in counts) or len({n for _, n in counts}) != 1:
        return None
    before = [c for row in rows for c in row["counts"][b][0]]
    after = [c for row in rows for c in row["counts"][a][0]]
    null = permutation_null(before, after, counts[0][1], confidence, seed=seed, k=rows[0]["null_k"])
    return {key: null[key] for key in ("value", "ci_low", "ci_high", "p_value")}


def comparison_table(per_seed_rows: list[list[dict]], confidence: float, seed: int) -> list[dict]:
    """The table of one seed (one list of rows) or pooled over seeds.

    Each row: ``claim``, ``metric``, ``kind``, ``source``, ``arms`` and ``differences``. ``arms`` maps the base and
    each arm to None (does not apply) or ``{"value", "ci_low", "ci_high"}``, plus ``"null"`` (the same fields) for
    estimates that have one and ``"note": "not measured"`` (value None) where the results lack the figure; a value
    of None without a note is a figure the evaluation wrote without a value (NaN: e.g. no token after the prefix).
    ``differences`` (``"tandem - grpo"``, ``"kl_to_junior - grpo"``) hold the same fields and ``paired``:

    - per-problem rows: each arm's interval is the percentile bootstrap over problems of its per-problem values,
      the difference's a paired bootstrap over problems (``paired`` True); a pass@k row's difference (solo, handoff,
      accuracy, coverage) also has its permutation ``null`` (``value`` 0, ``ci_low``, ``ci_high``, ``p_value``):
      the same difference between two random halves of both arms' pooled samples, problem by problem;
    - estimate rows: each arm's interval is the evaluation's own; the difference is the row's
      ``paired_differences`` entry with its paired interval where one seed has it (``paired`` True), else the
      difference of the two values without an interval (``paired`` False);
    - scalar rows (the earlier estimators): values and differences without intervals.

    Pooled over seeds: per-problem values are averaged over seeds before the bootstrap; scalars and estimates are
    averaged (estimates then lose their interval) and get ``seed_range`` (each arm ``[min, max]`` over seeds).

    Args:
        per_seed_rows: one list of rows per seed (from ``comparison_rows``), all with the same rows in the same order.
        confidence: the intervals' confidence level, e.g. ``0.95``.
        seed: the bootstrap's seed.

    Returns:
        One dict a row, in the rows' order.

    Raises:
        ValueError: seeds with different numbers of rows or of problems.
    """
    table = []
    for rows in zip(*per_seed_rows, strict=True):
        first = rows[0]
        kind = first["kind"]
        out = {"claim": first["claim"], "metric": first["metric"], "kind": kind, "source": first.get("source"),
               "arms": {}, "differences": {}}  # fmt: skip
        pooled: dict[str, object] = {}
        for arm in ("base", *ARMS):
            pooled[arm], out["arms"][arm], spread = _pool(kind, [r["arms"].get(arm) for r in rows], confidence, seed)
            if kind != "per_problem" and len(rows) > 1:
                out.setdefault("seed_range", {})[arm] = spread
        for a, b in DIFFERENCES:
            key = f"{a} - {b}"
            ea, eb = out["arms"][a], out["arms"][b]
            va, vb = pooled[a], pooled[b]
            if ea is None or eb is None:
                out["differences"][key] = None
            elif "note" in ea or "note" in eb:
                out["differences"][key] = _not_measured()
            elif ea["value"] is None or eb["value"] is None:
                out["differences"][key] = {"value": None, "ci_low": None, "ci_high": None, "paired": False}
            elif kind == "per_problem":
                out["differences"][key] = _estimate([x - y for x, y in zip(va, vb, strict=True)], confidence, seed) | {
                    "paired": True
                }
                null = _pass_at_k_null(rows, a, b, confidence, seed)
                if null is not None:
                    out["differences"][key]["null"] = null
            elif len(rows) == 1 and key in (first.get("paired_differences") or {}):
                given = first["paired_differences"][key]
                out["differences"][key] = _interval(given) | {"paired": True}
            else:
                out["differences"][key] = {"value": va - vb, "ci_low": None, "ci_high": None, "paired": False}
        table.append(out)
    return table


def _figure(entry: dict) -> str:
    if entry.get("ci_low") is None or entry.get("ci_high") is None:
        return f"{entry['value']:.3f} (no interval)"
    return f"{entry['value']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]"


def _cell(entry: dict | None) -> str:
    """One cell: ``value [low, high]``, ``value (no interval)``, then ``; null ...`` where the figure has a null;
    ``—`` where it does not apply, ``not measured`` where the results lack it, ``undefined`` where it has no value."""
    if entry is None:
        return "—"
    if entry.get("value") is None:
        return entry.get("note") or "undefined"
    text = _figure(entry)
    null = entry.get("null")
    if null and null.get("value") is not None:
        text += f"; null {_figure(null)}"
    return text


def table_rows(table: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of a comparison table (see ``_cell`` for the cells' form)."""
    header = ["claim", "metric", *(LABELS[a] for a in ("base", *ARMS))]
    header += [f"{LABELS[a]} − {LABELS[b]}" for a, b in DIFFERENCES]
    cells = []
    for row in table:
        line = [row["claim"], row["metric"], *(_cell(row["arms"].get(a)) for a in ("base", *ARMS))]
        line += [_cell(row["differences"].get(f"{a} - {b}")) for a, b in DIFFERENCES]
        cells.append(line)
    return header, cells


def markdown_table(table: list[dict]) -> str:
    """A comparison table as a Markdown table (``|`` in cells escaped)."""
    header, cells = table_rows(table)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in cells]
    return "\n".join(lines)


def html_table(table: list[dict]) -> str:
    """A comparison table as an HTML ``<table>`` (cells escaped)."""
    header, cells = table_rows(table)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in line) + "</tr>" for line in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def sources(table: list[dict]) -> list[tuple[str, str]]:
    """``(metric, source)`` of each row of a comparison table: where in the evaluation's results.json it was read."""
    return [(row["metric"], row.get("source") or "") for row in table]
