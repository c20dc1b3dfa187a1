"""A named junior that does not fit the device fails before its weights load, with what to do instead."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import build_tiny_model, tiny_prompts, tiny_tandem_config

from tandem_grpo.junior import check_junior_fits, free_memory_bytes, junior_weight_bytes

GIB = 2**30


def test_a_junior_that_fits_passes_and_one_that_does_not_names_sizes_and_fixes():
    check_junior_fits("org/junior-7b", 8 * GIB, 8 * GIB, "cuda:0")  # exactly fits
    with pytest.raises(ValueError) as info:
        check_junior_fits("org/junior-7b", 14 * GIB, 8 * GIB, "cuda:0")
    message = str(info.value)
    assert re.search(r"`org/junior-7b`.*14\.00 GiB.*cuda:0 has 8\.00 GiB free", message), message
    assert "smaller junior" in message and "self-pairing" in message and "vllm_mode='server'" in message


def test_copies_count_processes_sharing_the_memory_and_zero3_shards():
    check_junior_fits("j", 6 * GIB, 8 * GIB, "cpu", copies=1)
    with pytest.raises(ValueError, match=r"12\.00 GiB \(2 x 6\.00 GiB on this device\) but cpu has 8\.00 GiB"):
        check_junior_fits("j", 6 * GIB, 8 * GIB, "cpu", copies=2)  # 2 processes on one machine, each a copy
    check_junior_fits("j", 12 * GIB, 8 * GIB, "cpu", copies=0.5)  # ZeRO-3 over 2 processes: half each


def test_weight_bytes_come_from_the_checkpoint_in_the_load_dtype(tmp_path):
    model = build_tiny_model(0)
    model.save_pretrained(tmp_path / "st")
    count = sum(p.numel() for p in model.parameters())
    assert junior_weight_bytes(str(tmp_path / "st"), torch.float32) == 4 * count
    assert junior_weight_bytes(str(tmp_path / "st"), torch.bfloat16) == 2 * count
    # .bin weights are counted by file size (their dtype is unknown without loading them).
    (tmp_path / "bin").mkdir()
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    size = (tmp_path / "bin" / "pytorch_model.bin").stat().st_size
    assert junior_weight_bytes(str(tmp_path / "bin"), torch.float32) == size
    (tmp_path / "empty").mkdir()
    assert junior_weight_bytes(str(tmp_path / "empty"), torch.float32) is None


def test_free_memory_of_the_cpu_is_the_available_system_memory():
    import psutil

    free = free_memory_bytes("cpu")
    assert 0 < free <= psutil.virtual_memory().total


def test_the_trainer_checks_before_loading_the_junior(tmp_path, tiny_model_dirs, tiny_tokenizer, monkeypatch):
    import tandem_grpo.junior as junior_module
    from tandem_grpo import TandemGRPOTrainer

    senior, junior = tiny_model_dirs
    seen = []

    def tiny_free_memory(device):
        seen.append(torch.device(device))
        return 1024  # 1 KiB: less than the tiny junior's weights

    def no_loading(*args, **kwargs):
        raise AssertionError("the junior's weights were loaded before the size check")

    monkeypatch.setattr(junior_module, "free_memory_bytes", tiny_free_memory)
    monkeypatch.setattr(junior_module, "load_frozen", no_loading)
    args = tiny_tandem_config(tmp_path, junior_model_name_or_path=junior)
    with pytest.raises(ValueError, match=rf"junior `{re.escape(junior)}` does not fit.*0\.00 GiB free"):
        TandemGRPOTrainer(model=senior, reward_funcs=lambda completions, **k: [0.0] * len(completions), args=args,
                          train_dataset=tiny_prompts(), processing_class=tiny_tokenizer)  # fmt: skip
    assert seen == [torch.device("cpu")]
