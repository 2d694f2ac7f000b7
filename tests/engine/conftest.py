"""The tiny model pairs the engine's exactness tests share, built once per test module (module scope, as each
module built its own before: a test that changes a model, such as its EOS token, affects only its module).

- `target` and `ar_tokens`: the greedy tests' 50-token target and its greedy AR tokens for the module's
  PROMPTS under the module's GREEDY sampling parameters (each module states its own).
- `draft`: a noisy copy of `target` (it agrees on most tokens, not all); `solo`: each of the module's PROMPTS
  run alone by the eager AR engine under its GREEDY (what a request in a shared batch must get).
- `target8` and `draft8`: the statistical tests' 8-token target and its partly agreeing draft, whose first
  tokens' exact distribution tests/engine/tiny.py enumerates.
A module that defines a fixture of the same name uses its own."""

import pytest

from engine import LLM
from tests.engine import tiny


@pytest.fixture(scope="module")
def target():
    return tiny.tiny_lm(0, scale=4.0)


@pytest.fixture(scope="module")
def draft(target):
    return tiny.noisy_copy(target, 1.0)


@pytest.fixture(scope="module")
def solo(target, request):
    module = request.module
    llm = LLM(target)
    return [llm.generate([p], module.GREEDY)[0].token_ids for p in module.PROMPTS]


@pytest.fixture(scope="module")
def ar_tokens(target, request):
    module = request.module
    return [o.token_ids for o in LLM(target).generate(module.PROMPTS, module.GREEDY)]


@pytest.fixture(scope="module")
def target8():
    return tiny.tiny_lm(0, vocab_size=tiny.V, hidden=16, scale=6.0)


@pytest.fixture(scope="module")
def draft8(target8):
    return tiny.noisy_copy(target8, noise=1.5, seed=1)
