"""Decoding: greedy, sampling and beam search with a KV cache.

    from attnlab.decoding import generate
    out = generate(model, prompt_ids, max_new_tokens=50, do_sample=True, top_p=0.9,
                   generator=torch.Generator().manual_seed(0))

Modules: `generate.py` (the entry point and its checks), `search.py` (greedy and sampling
loop), `beam.py` (beam search), `processors.py` (repetition penalty, n-gram ban, top-k,
top-p), `runner.py` (the runner protocol: cached next-token logits through the stack's `step`,
the full-forward reference, the recurrent state), `quantize.py` (opt-in bf16/int8 weights for
decoding: `quantize_weights(model, "int8")`).
"""

from attnlab.decoding.beam import beam_search
from attnlab.decoding.generate import GenerateOutput, generate
from attnlab.decoding.processors import no_repeat_ngram, repetition_penalty, top_k_filter, top_p_filter
from attnlab.decoding.quantize import QuantizedLinear, quantize_weights
from attnlab.decoding.runner import sequence_log_probs

__all__ = [
    "GenerateOutput", "QuantizedLinear", "beam_search", "generate", "no_repeat_ngram", "quantize_weights",
    "repetition_penalty", "sequence_log_probs", "top_k_filter", "top_p_filter",
]
