"""The one vocabulary check of every entry point (trainer, vLLM engine and server, evaluation): same token strings,
logits that cover the tokenizer; widths that differ only by embedding padding are accepted."""

from __future__ import annotations

import pytest
from conftest import TINY_VOCAB, build_tiny_model, pad_vocabulary
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from tandem_grpo.junior import check_junior_vocabulary, check_same_vocabulary

SIZE = len(TINY_VOCAB)


def _swapped_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(TINY_VOCAB)}
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


@pytest.mark.parametrize(("senior_width", "junior_width"), [(SIZE, SIZE), (SIZE, SIZE + 3), (SIZE + 128, SIZE)])
def test_padded_widths_are_accepted(tiny_tokenizer, senior_width, junior_width):
    check_same_vocabulary(tiny_tokenizer, tiny_tokenizer, senior_width, junior_width)


def test_logits_narrower_than_the_tokenizer_are_refused(tiny_tokenizer):
    with pytest.raises(
        ValueError, match=f"junior's logits have {SIZE - 2} entries but the shared tokenizer has {SIZE}"
    ):
        check_same_vocabulary(tiny_tokenizer, tiny_tokenizer, SIZE, SIZE - 2)


def test_other_token_strings_are_refused_naming_the_ids(tiny_tokenizer):
    # Same size and width: only the id-to-token maps differ.
    with pytest.raises(ValueError, match=r"map 2 ids to different tokens \(id 2: 'a' vs 'b', id 3: 'b' vs 'a'; "):
        check_same_vocabulary(tiny_tokenizer, _swapped_tokenizer(), SIZE, SIZE)
    with pytest.raises(ValueError, match="Pick a junior trained with the senior's tokenizer"):
        check_same_vocabulary(tiny_tokenizer, _swapped_tokenizer(), SIZE, SIZE + 3)


def test_a_junior_tokenizer_of_another_size_is_refused_naming_both_sizes(tiny_tokenizer):
    # Another model family: a smaller tokenizer whose first ids hold other tokens, so every id differs.
    small = {f"t{i}": i for i in range(10)}
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(small, unk_token="t0")))
    with pytest.raises(ValueError, match=rf"have different sizes \(senior {SIZE} tokens, junior 10\) and map {SIZE} "
                       rf"ids to different tokens \(id 0: '<pad>' vs 't0', .* id 4: 'c' vs 't4'; "):  # fmt: skip
        check_same_vocabulary(tiny_tokenizer, other, SIZE, SIZE)
    # The same size: no size to report, only the ids.
    with pytest.raises(ValueError) as same_size:
        check_same_vocabulary(tiny_tokenizer, _swapped_tokenizer(), SIZE, SIZE)
    assert "different sizes" not in str(same_size.value)


def test_junior_checkpoint_with_padded_embeddings_is_accepted(tmp_path, tiny_tokenizer):
    wide = tmp_path / "wide"
    pad_vocabulary(build_tiny_model(1), 3).save_pretrained(wide)
    tiny_tokenizer.save_pretrained(wide)
    assert check_junior_vocabulary(tiny_tokenizer, SIZE, str(wide)) == str(wide)
    other = tmp_path / "other"
    build_tiny_model(1).save_pretrained(other)
    _swapped_tokenizer().save_pretrained(other)
    with pytest.raises(ValueError, match="id 2: 'a' vs 'b'"):
        check_junior_vocabulary(tiny_tokenizer, SIZE, str(other))
