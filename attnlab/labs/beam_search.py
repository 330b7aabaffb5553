"""Lab `beam-search`: beam search over a next-token model (Sutskever et al. 2014; the length
penalty of Wu et al. 2016).

The student writes `beam_search(next_logprobs, prompt, *, num_beams, max_new_tokens,
eos_token_id, length_penalty) -> new tokens`; the checks hold it to attnlab's own beam search
(`attnlab.decoding.beam`, itself tested token for token against Hugging Face's) with early
stopping, on a small random trigram model, and to beam 1 == greedy.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch
from torch import Tensor

from attnlab.decoding.beam import beam_search as reference_beam_search
from attnlab.decoding.runner import Runner
from attnlab.decoding.search import DecodeOptions
from attnlab.labs.base import Check, CheckFailed, Lab, need

STUB = '''"""Lab beam-search: beam search with a length penalty (Sutskever et al. 2014; Wu et al. 2016).

Check it with `attnlab lab check beam-search`: it is run on a small random model and compared
with attnlab's beam search (generate(num_beams=K, early_stopping=True)).
"""

import torch


def beam_search(next_logprobs, prompt, *, num_beams, max_new_tokens, eos_token_id=None, length_penalty=1.0):
    """The best continuation of `prompt` found with `num_beams` beams.

    Args:
        next_logprobs: the model: next_logprobs(tokens) takes a list of token ids (the prompt and
            what follows) and returns a 1-D tensor (V,) of log-probabilities of the next token.
        prompt: a list of token ids.
        num_beams: K, the beams kept at each step.
        max_new_tokens: the most tokens to add.
        eos_token_id: the end token, or None.
        length_penalty: a finished hypothesis scores  sum of its new tokens' log-probs / n ** length_penalty,
            n = its number of new tokens (EOS included).

    Returns:
        the new tokens (a list of ints, without the prompt) of the best-scoring finished hypothesis.

    The search (these rules make it equal to attnlab's and Hugging Face's beam search):
        - start with one beam, the prompt, with log-probability 0;
        - each step, every beam proposes every token: candidate = (beam's sum of log-probs +
          log p(token)); rank all candidates of all beams together, best first;
        - walk the ranking: a candidate ending in EOS that ranks among the first K becomes a
          finished hypothesis (one ranked lower is dropped); the first K candidates not ending in
          EOS become the next step's beams;
        - at the last step (the max_new_tokens-th token), every candidate among the first K
          becomes a finished hypothesis, EOS or not;
        - stop as soon as K hypotheses are finished (early stopping), or after the last step;
          return the best one by score.

    Hints:
        - keep beams as (sum_logprob, tokens) pairs; torch.topk over a (K * V,) tensor ranks candidates
        - with K = 1 and no EOS this is greedy decoding
    """
    raise NotImplementedError("write beam_search(): see the docstring")
'''

SOLUTION = '''"""The reference solution of lab beam-search: attnlab's beam search, on a runner over the model."""

from attnlab.labs.beam_search import reference


def beam_search(next_logprobs, prompt, *, num_beams, max_new_tokens, eos_token_id=None, length_penalty=1.0):
    return reference(next_logprobs, prompt, num_beams=num_beams, max_new_tokens=max_new_tokens,
                     eos_token_id=eos_token_id, length_penalty=length_penalty)
'''

V, EOS = 12, 1


class _FunctionRunner(Runner):
    """A decoding runner over a function of the tokens so far (no cache: expand/reorder keep nothing)."""

    def __init__(self, next_logprobs: Callable[[list[int]], Tensor]):
        self.next_logprobs = next_logprobs

    def start(self, prompt, mask):
        return self.step(prompt, mask)

    def step(self, ids, mask):
        return torch.stack([self.next_logprobs([i for i in row if i >= 0]) for row in ids.tolist()])

    def expand(self, index):
        pass

    def reorder(self, index):
        pass


def reference(next_logprobs: Callable[[list[int]], Tensor], prompt: list[int], *, num_beams: int,
              max_new_tokens: int, eos_token_id: int | None = None, length_penalty: float = 1.0) -> list[int]:
    """attnlab's beam search (early stopping) with the lab's signature: the best hypothesis's new tokens."""
    P = len(prompt)
    ids = torch.full((1, P + max_new_tokens), -1, dtype=torch.long)
    ids[0, :P] = torch.tensor(prompt)
    opt = DecodeOptions(eos=None if eos_token_id is None else torch.tensor([eos_token_id]), pad_token_id=-1)
    out, _ = reference_beam_search(_FunctionRunner(next_logprobs), ids, torch.ones_like(ids, dtype=torch.bool), P,
                                   max_new_tokens, opt, num_beams=num_beams, length_penalty=length_penalty,
                                   early_stopping=True, num_return_sequences=1, padded=False)
    return [t for t in out[0, P:].tolist() if t >= 0]


def toy_model(seed: int, eos_boost: float = 0.0) -> Callable[[list[int]], Tensor]:
    """A random trigram model over V tokens: log p(next | last two tokens); `eos_boost` makes
    EOS likelier (so that hypotheses finish early)."""
    table = torch.randn(V, V, V, generator=torch.Generator().manual_seed(seed)) * 2.0
    table[..., EOS] += eos_boost

    def next_logprobs(tokens: list[int]) -> Tensor:
        a, b = ([0, 0] + list(tokens))[-2:]
        return table[a, b].log_softmax(-1)

    return next_logprobs


def _run(module: ModuleType, model, prompt, **kw) -> list[int]:
    got = need(module, "beam_search")(model, list(prompt), **kw)
    if isinstance(got, Tensor):
        got = got.tolist()
    if not isinstance(got, list) or not all(isinstance(t, int) for t in got):
        raise CheckFailed(f"expected a list of token ids, got {got!r}")
    return got


def _setting(prompt, kw) -> str:
    return f"prompt {prompt}, " + ", ".join(f"{k}={v}" for k, v in kw.items())


def _compare(module: ModuleType, cases) -> None:
    for seed, boost, prompt, kw in cases:
        model = toy_model(seed, boost)
        got, expected = _run(module, model, prompt, **kw), reference(model, prompt, **kw)
        if got != expected:
            raise CheckFailed(f"model {seed}, {_setting(prompt, kw)}: expected {expected}, got {got}")


def check_returns_new_tokens(module):
    got = _run(module, toy_model(0), [3, 4], num_beams=2, max_new_tokens=5)
    if len(got) != 5:
        raise CheckFailed(f"without EOS, expected max_new_tokens=5 new tokens (the prompt left out), got {got}")


def check_greedy(module):
    for seed in range(3):
        model, tokens = toy_model(seed), [2, 5]
        for _ in range(6):  # greedy by hand: the argmax, six times
            tokens.append(int(model(tokens).argmax()))
        got = _run(module, model, [2, 5], num_beams=1, max_new_tokens=6)
        if got != tokens[2:]:
            raise CheckFailed(f"num_beams=1 on model {seed}: expected the greedy tokens {tokens[2:]}, got {got}")


def check_no_eos(module):
    _compare(module, [(s, 0.0, [2, 7], {"num_beams": k, "max_new_tokens": 6}) for s in range(3) for k in (2, 3, 4)])


def check_eos(module):
    _compare(module, [(s, 2.5, [4], {"num_beams": k, "max_new_tokens": 8, "eos_token_id": EOS})
                      for s in range(4) for k in (2, 3)])


def check_length_penalty(module):
    _compare(module, [(s, 2.0, [6, 2], {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": EOS,
                                        "length_penalty": lp}) for s in range(3) for lp in (0.0, 2.0, -1.0)])


CHECKS = (
    Check("returns the new tokens", check_returns_new_tokens),
    Check("beam 1 == greedy", check_greedy),
    Check("equals attnlab's beam search without EOS", check_no_eos),
    Check("equals attnlab's beam search with EOS", check_eos),
    Check("length penalty", check_length_penalty),
)

LAB = Lab(name="beam-search", filename="beam_search.py",
          writes="beam_search(next_logprobs, prompt, *, num_beams, max_new_tokens, eos_token_id, length_penalty)",
          lecture="[T] The Transformer: decoding", stub=STUB, solution=SOLUTION, checks=CHECKS)
