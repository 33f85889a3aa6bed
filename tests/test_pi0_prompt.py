"""openpi's prompts: the text cleaned, BOS first, pi0's separate "\\n", pi0.5's discrete state,
padding with id 0 and a mask, cut at max_token_len."""

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the vlm extra (make install puts it in)")

from fleetrl.agents.pi0.prompt import prompt_text, tokenize_prompts  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    import transformers

    from fleetrl.agents.hf.tiny_builds import byte_level_bpe

    bpe = byte_level_bpe(["pick up the black bowl", "Task: State: Action:"], 300, ("<pad>", "<bos>", "<eos>"),
                         "the test")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>")


def test_pi0s_prompt_is_the_cleaned_text_then_a_separate_newline(tokenizer):
    assert prompt_text("  pick_up the\nbowl \n") == ("pick up the bowl", True)
    ids, mask = tokenize_prompts(tokenizer, ["pick_up the bowl "], 16)
    text = tokenizer.encode("pick up the bowl", add_special_tokens=False)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    expected = [tokenizer.bos_token_id, *text, *newline]
    assert ids[0, :len(expected)].tolist() == expected and (ids[0, len(expected):] == 0).all()
    assert mask[0].tolist() == [True] * len(expected) + [False] * (16 - len(expected))


def test_pi05s_discrete_state_goes_into_the_prompt_in_256_bins(tokenizer):
    state = np.array([-1.0, 0.0, 0.999, -1.5], np.float32)
    text, newline = prompt_text("pick up the bowl", state)
    assert text == "Task: pick up the bowl, State: 0 128 255 -1;\nAction: " and not newline
    ids, mask = tokenize_prompts(tokenizer, ["pick up the bowl"], 200, state[None])
    expected = [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]
    assert ids[0, :len(expected)].tolist() == expected and mask[0].sum() == len(expected)


def test_a_long_prompt_is_cut_at_max_token_len(tokenizer):
    ids, mask = tokenize_prompts(tokenizer, ["pick up the black bowl " * 20], 12)
    assert ids.shape == (1, 12) and mask.all() and ids[0, 0] == tokenizer.bos_token_id


def _bytes(texts: list[str], width: int = 64) -> np.ndarray:
    rows = np.zeros((len(texts), width), np.uint8)
    for i, text in enumerate(texts):
        rows[i, :len(text)] = np.frombuffer(text.encode(), np.uint8)
    return rows


class CountingTokenizer:
    """The real tokenizer, counting the texts it encodes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.texts = tokenizer, []
        self.bos_token_id = tokenizer.bos_token_id

    def encode(self, text, **kwargs):
        self.texts.append(text)
        return self.tokenizer.encode(text, **kwargs)


def test_the_batch_prompt_tokenizer_gives_openpis_ids_tokenizing_each_instruction_once(tokenizer):
    from fleetrl.agents.pi0.prompt import PromptTokenizer

    counting = CountingTokenizer(tokenizer)
    prompts = PromptTokenizer(counting, 48, bucket=8)
    texts = ["pick up the bowl", "pick up the black bowl", "pick up the bowl"]
    ids, mask = prompts(_bytes(texts))
    expected_ids, expected_mask = tokenize_prompts(tokenizer, texts, 48)
    longest = int(expected_mask.sum(1).max())
    assert ids.shape[1] == -(-longest // 8) * 8 < 48 and not expected_mask[:, ids.shape[1]:].any()
    assert np.array_equal(ids, expected_ids[:, :ids.shape[1]]) and np.array_equal(mask, expected_mask[:, :ids.shape[1]])
    encoded = len(counting.texts)
    prompts(_bytes(texts[::-1] * 4))
    assert len(counting.texts) == encoded  # every instruction was already known
    assert encoded == 2 * 2  # two distinct instructions, each its text and the answer's "\n"


def test_pi05s_state_prompts_are_tokenized_per_sample_and_cut_too(tokenizer):
    from fleetrl.agents.pi0.prompt import PromptTokenizer

    states = np.array([[0.5, -0.5], [0.1, 0.2]], np.float32)
    ids, mask = PromptTokenizer(tokenizer, 200)(_bytes(["pick up the bowl"] * 2), states)
    expected_ids, expected_mask = tokenize_prompts(tokenizer, ["pick up the bowl"] * 2, 200, states)
    assert ids.shape[1] < 200 and np.array_equal(ids, expected_ids[:, :ids.shape[1]])
    assert mask.sum() == expected_mask.sum() and not np.array_equal(ids[0], ids[1])
