"""Integrated gradients and gradient x input at the embeddings: equal to captum's on the same
function, baseline, steps and rule; complete (sum = f(x) - f(x')) on every text family and side;
causal where the model is; clear errors."""

import captum.attr
import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.inspect.attribution import (embedding_site, gradient_x_input, integrated_gradients,
                                         integration_points)

V = 23


def _model(arch, **extra):
    if arch == "rnn_encoder_decoder":
        cfg = ModelConfig(arch=arch, vocab_size=V, d_model=8, dropout=0.0, rnn={"hidden_size": 8, **extra})
    else:
        cfg = ModelConfig(arch=arch, vocab_size=V, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0,
                          **extra)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # larger weights than the initialisation's: attributions far from zero
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model


def _inputs(arch, B=2):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (B, 6), generator=g)
    return (ids,) if arch in ("decoder", "encoder") else (ids, torch.randint(1, V, (B, 5), generator=g))


def _embedding_function(model, module, inputs, position, token, call=0):
    """f(emb): the model run with `module`'s `call`-th output replaced by emb (rows = any multiple
    of the batch), scored as the log-probability of `token` at `position`; written here apart from
    the code under test."""
    B = inputs[0].shape[0]

    def f(emb):
        n = emb.shape[0] // B
        count = [0]

        def swap(mod, args, out):
            count[0] += 1
            return emb if count[0] - 1 == call else None

        handle = module.register_forward_hook(swap)
        try:
            logits = model(*(x.repeat(n, 1) for x in inputs))
        finally:
            handle.remove()
        return torch.log_softmax(logits[:, position], -1)[:, token]

    return f


def _embedding(model, module, inputs, call=0):
    seen = []
    handle = module.register_forward_hook(lambda mod, args, out: seen.append(out))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        handle.remove()
    return seen[call]


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_trapezoid", "riemann_middle", "riemann_left",
                                    "riemann_right"])
def test_integrated_gradients_equal_captums(method):
    model = _model("decoder")
    inputs = _inputs("decoder")
    x = _embedding(model, model.embed, inputs)
    baseline = 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    ours = integrated_gradients(model, *inputs, target=5, position=3, steps=16, method=method, baseline=baseline)
    f = _embedding_function(model, model.embed, inputs, 3, 5)
    theirs, delta = captum.attr.IntegratedGradients(f).attribute(x, baselines=baseline, n_steps=16, method=method,
                                                                  return_convergence_delta=True)
    if method == "riemann_trapezoid":
        # captum's trapezoid weights are 1/n with the two ends halved (summing to (n - 1)/n); the
        # composite trapezoid rule on n points spaced 1/(n - 1) has 1/(n - 1): ours, scaled by n/(n - 1)
        theirs = theirs * 16 / 15
        delta = theirs.sum((1, 2)) - (ours.value - ours.baseline_value)
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours.delta, delta.float(), rtol=1e-3, atol=1e-5)
    assert ours.attributions.abs().max() > 1e-3  # not zero: the comparison means something


def test_pad_baseline_equals_captums_layer_integrated_gradients():
    """baseline='pad' is the embedding module's output on pad ids: captum's LayerIntegratedGradients
    on that module with pad ids as the input baseline."""
    model = _model("decoder")
    (ids,) = _inputs("decoder")
    ours = integrated_gradients(model, ids, target=7, position=-1, steps=20, baseline="pad")

    def f(batch_ids):
        return torch.log_softmax(model(batch_ids)[:, -1], -1)[:, 7]

    lig = captum.attr.LayerIntegratedGradients(f, model.embed)
    theirs = lig.attribute(ids, baselines=torch.full_like(ids, model.config.pad_token_id), n_steps=20)
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-4, atol=1e-6)


def test_gradient_x_input_equals_captums():
    model = _model("decoder")
    inputs = _inputs("decoder")
    ours = gradient_x_input(model, *inputs, target=2, position=4)
    x = _embedding(model, model.embed, inputs)
    theirs = captum.attr.InputXGradient(_embedding_function(model, model.embed, inputs, 4, 2)).attribute(
        x.requires_grad_(True))
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ours.scores, theirs.sum(-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch,side,extra", [
    ("decoder", None, {}),
    ("encoder_decoder", "source", {}),
    ("encoder_decoder", "target", {}),
    ("encoder_decoder", "target", {"tie_embeddings": True}),
    ("rnn_encoder_decoder", "source", {"cell": "lstm"}),
    ("rnn_encoder_decoder", "target", {"cell": "gru", "attention": "additive"}),
])
def test_completeness_on_every_family_and_side(arch, side, extra):
    model = _model(arch, **extra)
    inputs = _inputs(arch)
    att = integrated_gradients(model, *inputs, side=side, steps=64, baseline="pad")
    gap = att.value - att.baseline_value
    assert gap.abs().max() > 2e-3  # a real difference to account for
    tolerance = 2e-3 * gap.abs().max().item()
    torch.testing.assert_close(att.attributions.sum((1, 2)), gap, rtol=0, atol=tolerance)
    assert att.delta.abs().max() < tolerance


def test_zero_baseline_behind_a_layernorm_shows_in_delta():
    """Post-LN layers normalise the embeddings first: f(alpha x) = f(x) but next to alpha = 0, so
    integrating from zeros misses the jump and delta says so; the default pad baseline does not."""
    model = _model("decoder", norm_placement="post", position={"scheme": "learned", "max_len": 16})
    inputs = _inputs("decoder")
    zeros = integrated_gradients(model, *inputs, baseline="zeros", steps=32)
    pad = integrated_gradients(model, *inputs, steps=32)  # the default where the config has a pad token
    assert pad.baseline == "pad" and zeros.baseline == "zeros"
    assert zeros.delta.abs().max() > 0.2 * (zeros.value - zeros.baseline_value).abs().max()
    assert pad.delta.abs().max() < 1e-2 * (pad.value - pad.baseline_value).abs().max()


def test_target_side_of_a_shared_table_is_the_decoder_call():
    """A recurrent model with one table for both sides: the target site is the table's second call;
    its attributions match the reference function that swaps that call."""
    model = _model("rnn_encoder_decoder", cell="gru")
    assert model.src_embed is model.tgt_embed
    site = embedding_site(model, "target")
    assert site.call == 1
    inputs = _inputs("rnn_encoder_decoder")
    ours = gradient_x_input(model, *inputs, side="target", target=3, position=2)
    x = _embedding(model, model.tgt_embed, inputs, call=1)
    f = _embedding_function(model, model.tgt_embed, inputs, 2, 3, call=1)
    theirs = captum.attr.InputXGradient(f).attribute(x.requires_grad_(True))
    torch.testing.assert_close(ours.attributions, theirs, rtol=1e-5, atol=1e-7)
    assert ours.attributions.shape[1] == inputs[1].shape[1]


def test_a_decoder_gives_nothing_to_later_tokens():
    model = _model("decoder")
    att = integrated_gradients(model, *_inputs("decoder"), position=2, steps=8)
    assert (att.scores[:, 3:] == 0).all() and (att.scores[:, :3] != 0).all()


def test_no_target_scores_the_predicted_token_and_a_metric_is_used_as_given():
    model = _model("decoder")
    inputs = _inputs("decoder")
    predicted = model(*inputs)[:, -1].argmax(-1)
    att = gradient_x_input(model, *inputs)
    assert torch.equal(att.target, predicted)
    by_hand = gradient_x_input(model, *inputs, target=predicted)
    torch.testing.assert_close(att.attributions, by_hand.attributions)
    metric = gradient_x_input(model, *inputs, target=lambda out: torch.log_softmax(out[:, -1], -1)
                              .gather(-1, predicted.repeat(out.shape[0] // 2)[:, None])[:, 0])
    torch.testing.assert_close(metric.attributions, att.attributions)
    logit = gradient_x_input(model, *inputs, target=predicted, score="logit")
    assert not torch.allclose(logit.attributions, att.attributions)


def test_batching_the_points_changes_nothing():
    model = _model("encoder_decoder")
    inputs = _inputs("encoder_decoder")
    whole = integrated_gradients(model, *inputs, target=4, steps=10)
    parts = integrated_gradients(model, *inputs, target=4, steps=10, batch_points=3)
    torch.testing.assert_close(whole.attributions, parts.attributions, rtol=1e-5, atol=1e-7)


def test_integration_points_integrate_polynomials():
    """Gauss-Legendre with n points is exact for degree 2n - 1; the trapezoid for degree 1."""
    alphas, weights = integration_points(4, "gausslegendre")
    assert sum(w * a ** 7 for a, w in zip(alphas, weights)) == pytest.approx(1 / 8, abs=1e-12)
    alphas, weights = integration_points(5, "riemann_trapezoid")
    assert alphas[0] == 0 and alphas[-1] == 1
    assert sum(w * (3 * a + 1) for a, w in zip(alphas, weights)) == pytest.approx(2.5, abs=1e-12)


def test_the_model_keeps_its_mode():
    model = _model("decoder").train()
    integrated_gradients(model, *_inputs("decoder"), steps=2)
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize("kwargs,message", [
    ({"method": "simpson"}, "method="),
    ({"steps": 0}, "steps must be"),
    ({"method": "riemann_trapezoid", "steps": 1}, "steps must be"),
    ({"side": "source"}, "side='source'"),
    ({"baseline": "ones"}, "baseline="),
    ({"baseline": torch.zeros(3, 3)}, "baseline must have"),
    ({"target": V}, "target ids must lie"),
    ({"target": [1, 2, 3]}, "one token id or one per row"),
    ({"position": 6}, "position=6"),
    ({"score": "prob"}, "score="),
    ({"target": lambda out: out.sum()}, "one number per row"),
])
def test_errors_name_the_argument(kwargs, message):
    model = _model("decoder")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        integrated_gradients(model, *_inputs("decoder"), steps=kwargs.pop("steps", 4), **kwargs)
