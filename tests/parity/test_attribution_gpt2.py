"""Integrated gradients on GPT-2 weights (a small random GPT2LMHeadModel converted by
`attnlab.from_hf`) equal captum's on the same model, baseline and steps; GPT-2 has no pad token,
so the default baseline is zeros."""

import captum.attr
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import attnlab
from attnlab.inspect.attribution import integrated_gradients


def test_integrated_gradients_on_gpt2_equal_captums():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=61, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = attnlab.from_hf(GPT2LMHeadModel(config).eval()).eval()
    assert model.config.pad_token_id is None
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    ours = integrated_gradients(model, ids, target=11, position=-1, steps=24)
    assert ours.baseline == "zeros"

    def f(emb):  # the model with its embedding output replaced by emb (n * B rows)
        handle = model.embed.register_forward_hook(lambda mod, args, out: emb)
        try:
            logits = model(ids.repeat(emb.shape[0] // ids.shape[0], 1))
        finally:
            handle.remove()
        return torch.log_softmax(logits[:, -1], -1)[:, 11]

    with torch.no_grad():
        x = model.embed(ids, torch.arange(7)[None])
    theirs, delta = captum.attr.IntegratedGradients(f).attribute(x, baselines=torch.zeros_like(x), n_steps=24,
                                                                  return_convergence_delta=True)
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(ours.delta, delta.float(), rtol=1e-3, atol=1e-6)
    assert ours.scores.abs().max() > 1e-4
