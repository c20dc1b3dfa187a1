"""What makes a vLLM request a tandem request: its ``SamplingParams.extra_args``
([`tandem_extra_args`][tandem_grpo.vllm.request_args.tandem_extra_args], or the OpenAI server's ``vllm_xargs``) and
their checks ([`validate_tandem_params`][tandem_grpo.vllm.request_args.validate_tandem_params]). A tandem request
carries its temperature and truncation there and turns vLLM's own off (temperature 1, no truncation); it must sample
(``temperature > 0``). Other requests in a batch are left untouched. Why: docs/api/vllm/request_args.md.
"""

from __future__ import annotations

from vllm import SamplingParams

from ..handoff import HandoffRule
from ..sampling import SamplingSettings

SEED_KEY = "tandem_seed"
UID_KEY = "tandem_uid"
GRANULARITY_KEY = "tandem_granularity"
PROBABILITY_KEY = "tandem_junior_probability"
MAX_GAP_KEY = "tandem_max_gap_tokens"
MODE_KEY = "tandem_handoff_mode"
TOP_K_KEY = "tandem_top_k"
TOP_P_KEY = "tandem_top_p"
MIN_P_KEY = "tandem_min_p"
TEMPERATURE_KEY = "tandem_temperature"
_SAMPLING_EPS = 1e-5  # vLLM's threshold below which a request is greedy
_RULE_KEYS = {"granularity": GRANULARITY_KEY, "junior_probability": PROBABILITY_KEY, "max_gap_tokens": MAX_GAP_KEY,
              "mode": MODE_KEY}  # fmt: skip
_DEFAULT_RULE = HandoffRule()  # a key left out of the extra args takes the rule's default (HandoffSettings')
SENIOR_ONLY_OPTIONS = ("logit_bias", "min_tokens", "bad_words", "allowed_token_ids", "structured_outputs")
"""SamplingParams fields that vLLM applies to the senior's logits alone: a tandem request may not set them."""


def tandem_extra_args(seed: int, uid: str, rule: HandoffRule, sampling: SamplingSettings | None = None) -> dict:
    """``SamplingParams.extra_args`` (or the OpenAI server's ``vllm_xargs``) that make a request a tandem request.

    Args:
        seed: the request's coin-stream seed (any int; hashed to 32 bits by the rule).
        uid: a string unique per request, the key of its side records
            ([`pop_records`][tandem_grpo.vllm.side_records.pop_records]).
        rule: the handoff rule.
        sampling: its ``temperature`` scales both models and its ``top_k``, ``top_p`` and ``min_p`` truncate the
            mixture here (default: temperature 1, no truncation); the request's own temperature must be 1 and its
            ``top_k``/``top_p``/``min_p`` off ([`request_fields`][tandem_grpo.vllm.engine.request_fields]); its
            repetition, frequency and presence penalties are the request's.
    """
    sampling = sampling or SamplingSettings()
    return {
        SEED_KEY: int(seed),
        UID_KEY: str(uid),
        **{key: getattr(rule, name) for name, key in _RULE_KEYS.items()},
        TOP_K_KEY: int(sampling.top_k),
        TOP_P_KEY: float(sampling.top_p),
        MIN_P_KEY: float(sampling.min_p),
        TEMPERATURE_KEY: float(sampling.temperature),
    }


def is_tandem_request(params: SamplingParams) -> bool:
    return bool(params.extra_args) and SEED_KEY in params.extra_args


def rule_from_extra_args(extra: dict) -> HandoffRule:
    """The request's handoff rule; a key left out takes the rule's default.

    Raises:
        ValueError: a rule field of the wrong type or outside its range
            ([`HandoffRule.checked`][tandem_grpo.handoff.HandoffRule.checked]).
    """
    return HandoffRule.checked(**{n: extra.get(k, getattr(_DEFAULT_RULE, n)) for n, k in _RULE_KEYS.items()})


def sampling_from_params(params: SamplingParams) -> SamplingSettings:
    """A tandem request's sampling settings: temperature and truncation from its extra args (the temperature from the
    request where the extra args have none), repetition penalty from the request.

    Raises:
        ValueError: a value outside its range (see [`SamplingSettings`][tandem_grpo.sampling.SamplingSettings]).
    """
    extra = params.extra_args or {}
    return SamplingSettings(
        temperature=float(extra.get(TEMPERATURE_KEY, params.temperature)),
        top_k=extra.get(TOP_K_KEY, 0),
        top_p=extra.get(TOP_P_KEY, 1.0),
        min_p=extra.get(MIN_P_KEY, 0.0),
        repetition_penalty=float(params.repetition_penalty),
    )


def validate_tandem_params(params: SamplingParams) -> None:
    """Reject a tandem request whose settings the mixture cannot honour; other requests pass. Runs in vLLM's API
    process, through
    [`TandemLogitsProcessor.validate_params`][tandem_grpo.vllm.processor_v1.TandemLogitsProcessor.validate_params].

    Raises:
        ValueError: bad ``tandem_*`` extra args, ``n != 1``, greedy sampling, a ``SamplingParams.temperature`` other
            than 1 beside ``tandem_temperature``, ``top_k``/``top_p``/``min_p`` set in SamplingParams (they belong in
            the extra args), or an option that vLLM applies to the senior's logits
            alone (``logit_bias``, ``min_tokens``, ``bad_words``, ``allowed_token_ids``, structured outputs).
    """
    if not is_tandem_request(params):
        return
    extra = params.extra_args
    seed, uid = extra.get(SEED_KEY), extra.get(UID_KEY)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{SEED_KEY}={seed!r} must be an integer.")
    if not isinstance(uid, str) or not uid:
        raise ValueError(f"{UID_KEY}={uid!r} must be a non-empty string unique per request.")
    rule_from_extra_args(extra)
    if params.n != 1:
        raise ValueError(
            f"Tandem requests take n=1 (got n={params.n}): send one request per completion, each "
            "with its own seed and uid."
        )
    temperature = extra.get(TEMPERATURE_KEY, params.temperature)
    if TEMPERATURE_KEY in extra and params.temperature != 1.0:
        raise ValueError(
            f"Tandem requests with extra_args['{TEMPERATURE_KEY}'] are scaled by the logits processor: send "
            f"SamplingParams(temperature=1.0) (got temperature={params.temperature})."
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < _SAMPLING_EPS:
        raise ValueError(
            f"Tandem requests must sample (temperature > 0, got {temperature!r}); there is no greedy tandem decoding."
        )
    if params.top_k not in (0, -1) or params.top_p < 1.0 or params.min_p:
        raise ValueError(
            f"Tandem requests truncate the mixture in the logits processor: pass top_k/top_p/min_p as "
            f"extra_args['{TOP_K_KEY}'/'{TOP_P_KEY}'/'{MIN_P_KEY}'] (tandem_extra_args(..., sampling)) and leave "
            f"SamplingParams' own off (got top_k={params.top_k}, top_p={params.top_p}, min_p={params.min_p})."
        )
    try:
        sampling_from_params(params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Tandem extra args: {exc}") from exc
    used = [name for name in SENIOR_ONLY_OPTIONS if getattr(params, name)]
    if used:
        raise ValueError(f"{used} act on the senior's logits alone in vLLM; tandem requests do not support them.")
