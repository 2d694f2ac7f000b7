"""Text on a real tokenizer (SmolLM2-135M): streamed text deltas add up to the output text, stop strings cut
the text before them in every strategy, and chat messages go through the chat template."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement

PROMPT = "The three primary colours are"
SPEC = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))


@pytest.fixture(scope="module")
def ar():
    with LLM("smollm2-135m", dtype="float32", chat_template=False) as llm:
        yield llm


@pytest.fixture(scope="module")
def greedy_text(ar):
    return ar.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False))[0].text


@pytest.mark.smoke
@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_stop_strings_cut_the_text_before_them_and_streams_add_up(ar, greedy_text, strategy):
    words = greedy_text.split()
    stop = words[len(words) // 2]  # a word the greedy output reaches half-way
    params = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False, stop=(stop, "never-seen"))
    if strategy == "ar":
        llm = ar
    else:
        llm = LLM(
            ar.target, ar.target, strategy=strategy, speculative=SPEC, tokenizer=ar.tokenizer, chat_template=False
        )
    chunks = list(llm.stream(PROMPT, params))
    out = llm.generate(PROMPT, params)[0]
    assert out.finish_reason == "stop"
    assert out.text == greedy_text[: greedy_text.index(stop)]
    assert "".join(c.text for c in chunks) == out.text
    assert chunks[-1].finish_reason == "stop" and chunks[-1].finished


@pytest.mark.smoke
def test_chat_messages_go_through_the_template_with_the_system_prompt(ar):
    ids = ar.encode_chat([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])
    text = ar.tokenizer.decode(ids)
    assert "You are terse." in text and "Hi" in text and text.index("You are terse.") < text.index("Hi")
    assert ar.encode("Hi", chat=True) == ar.encode_chat([{"role": "user", "content": "Hi"}])
    assert ar.encode("Hi", chat=False) == list(ar.tokenizer("Hi")["input_ids"])
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        ar.encode_chat([])
