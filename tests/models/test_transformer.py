"""The properties that define each model family, for every position scheme."""

import pytest
import torch

from attnlab import ModelConfig, build_model

from .helpers import SCHEMES, V, ids, tiny


def _run(model, arch, x, mask=None, src=None, src_mask=None):
    if arch == "encoder_decoder":
        return model(src, x, src_mask, mask)
    return model(x, mask)


# ---- causality: editing the future leaves the past unchanged --------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ["decoder", "encoder_decoder"])
def test_causality(arch, scheme):
    model = tiny(arch, scheme)
    src = ids(2, 6)
    x = ids(2, 10)
    out = _run(model, arch, x, src=src)
    for t in (0, 4, 8):
        edited = x.clone()
        edited[:, t + 1:] = ids(2, 10 - t - 1)
        out_edited = _run(model, arch, edited, src=src)
        torch.testing.assert_close(out_edited[:, : t + 1], out[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out_edited[:, t + 1:], out[:, t + 1:], atol=1e-4)  # the future does change


def test_encoder_is_not_causal():
    model = tiny("encoder")
    x = ids(1, 8)
    edited = x.clone()
    edited[0, -1] = (x[0, -1] % (V - 1)) + 1
    assert not torch.allclose(model(x)[:, 0], model(edited)[:, 0], atol=1e-5)


def test_prefix_lm_is_bidirectional_inside_the_prefix_only():
    model = tiny("decoder")
    x = ids(1, 10)
    prefix = torch.tensor([4])
    out = model(x, prefix_lengths=prefix)
    in_prefix = x.clone()
    in_prefix[0, 3] = (x[0, 3] % (V - 1)) + 1
    assert not torch.allclose(model(in_prefix, prefix_lengths=prefix)[:, 0], out[:, 0], atol=1e-5)
    after = x.clone()
    after[0, 7:] = ids(1, 3)
    torch.testing.assert_close(model(after, prefix_lengths=prefix)[:, :7], out[:, :7], atol=1e-5, rtol=1e-5)


# ---- padding invariance ---------------------------------------------------------------------

def _pad(x, n, side, value=0):
    pad = torch.full((x.shape[0], n), value, dtype=x.dtype)
    return torch.cat([x, pad] if side == "right" else [pad, x], dim=1)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch, side", [("encoder", "right"), ("decoder", "right"), ("decoder", "left"),
                                        ("encoder_decoder", "right")])
def test_padding_invariance(arch, side, scheme):
    model = tiny(arch, scheme)
    x, src = ids(1, 7), ids(1, 5)
    ref = _run(model, arch, x, src=src)
    n = 3
    xp = _pad(x, n, side)
    mask = _pad(torch.ones_like(x), n, side)
    srcp, src_mask = _pad(src, 2, "right"), _pad(torch.ones_like(src), 2, "right")
    if arch == "encoder_decoder":
        out = model(srcp, xp, src_mask, mask)
    else:
        out = model(xp, mask)
    real = out[:, :7] if side == "right" else out[:, n:]
    torch.testing.assert_close(real, ref, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()  # padded positions too: no NaN leaks into later layers


# ---- permutation equivariance -----------------------------------------------------------------

def test_encoder_stack_without_positions_is_permutation_equivariant():
    model = tiny("encoder", "none")
    x = ids(2, 9)
    perm = torch.randperm(9)
    torch.testing.assert_close(model(x[:, perm]), model(x)[:, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "none"])
def test_positions_break_permutation_equivariance(scheme):
    model = tiny("encoder", scheme)
    x = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]])
    perm = torch.tensor([8, 1, 2, 3, 4, 5, 6, 7, 0])
    assert not torch.allclose(model(x[:, perm]), model(x)[:, perm], atol=1e-4)


# ---- heads --------------------------------------------------------------------------------------

def test_decoder_classification_reads_the_last_real_token_under_either_padding():
    model = tiny("decoder", "rotary", head="classification", num_labels=3)
    x = ids(1, 6)
    ref = model(x)
    assert ref.shape == (1, 3)
    for side in ("left", "right"):
        out = model(_pad(x, 4, side), _pad(torch.ones_like(x), 4, side))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_encoder_heads_and_tying():
    mlm = tiny("encoder", head="mlm")
    assert mlm(ids(2, 5)).shape == (2, 5, V)
    assert mlm.head.decoder.weight is mlm.embed.token.weight
    cls = tiny("encoder", head="classification", num_labels=4, pooler=True, type_vocab_size=2)
    x = ids(2, 5)
    out = cls(x, token_type_ids=torch.tensor([[0, 0, 0, 1, 1]] * 2))
    assert out.shape == (2, 4)
    assert not torch.allclose(out, cls(x))  # segments matter
    enc_dec = tiny("encoder_decoder")
    assert enc_dec.encoder.embed.token is enc_dec.decoder.embed.token  # shared vocabulary
    assert enc_dec.decoder.head.proj.weight is enc_dec.decoder.embed.token.weight
    untied = tiny("encoder_decoder", tie_embeddings=False, share_embeddings=False, src_vocab_size=30)
    assert untied.encoder.embed.token.num_embeddings == 30
    assert untied.decoder.head.proj.weight is not untied.decoder.embed.token.weight


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    model = tiny("decoder")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[1, V]]))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids(2, 5), torch.ones(2, 4))
    with pytest.raises(ValueError, match="beyond the learned table"):
        model(ids(1, 65))
    with pytest.raises(ValueError, match="token_type_ids"):
        tiny("encoder")(ids(1, 3), token_type_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="ModelConfig"):
        build_model({"arch": "decoder"})


# ---- training signal ------------------------------------------------------------------------------

FAMILIES = {
    "decoder": dict(arch="decoder"),
    "encoder-mlm": dict(arch="encoder", head="mlm", pooler=True, type_vocab_size=2),
    "encoder-classification": dict(arch="encoder", head="classification", pooler=True),
    "encoder_decoder": dict(arch="encoder_decoder", share_embeddings=False, tie_embeddings=False),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", ["relative", "t5_bias", "rotary"])
def test_gradients_reach_every_parameter(family, scheme):
    model = tiny(scheme=scheme, **FAMILIES[family]).train()
    x = ids(2, 6)
    out = model(ids(2, 5), x) if family == "encoder_decoder" else model(x)
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    if family == "encoder-mlm":  # the pooler feeds no MLM logit, as in BERT
        missing = [n for n in missing if not n.startswith("pooler.")]
    assert not missing


def _overfit(model, step_loss, steps=300):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        loss = step_loss()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    return loss.item()


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder_decoder"])
@pytest.mark.parametrize("steps, below", [
    pytest.param(300, 0.05, id="overfit"),  # stops at 0.05, about 75 steps here
])
def test_tiny_model_overfits_one_batch(arch, steps, below):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, vocab_size=V, d_model=64, num_layers=2, num_heads=4, d_ff=128, dropout=0.0,
                      norm_placement="pre", position={"scheme": "sinusoidal"},
                      head="mlm" if arch == "encoder" else None)
    model = build_model(cfg)
    x, src = ids(4, 16), ids(4, 12)
    ce = torch.nn.functional.cross_entropy
    if arch == "decoder":
        loss = _overfit(model, lambda: ce(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1)), steps)
    elif arch == "encoder":
        corrupted = x.clone()
        corrupted[:, ::3] = 0  # a [MASK]-like id; predict the originals everywhere
        loss = _overfit(model, lambda: ce(model(corrupted).reshape(-1, V), x.reshape(-1)), steps)
    else:
        loss = _overfit(model, lambda: ce(model(src, x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1)), steps)
    assert loss < below


# ---- checkpoints from before the fused projections still load --------------------------------

def _legacy_state(model) -> dict:
    """The state dict as attnlab wrote it before q/k/v and w1/w3 were fused: q_proj, k_proj,
    v_proj per attention, w1 and w3 per gated feed-forward."""
    out = {}
    for name, t in model.state_dict().items():
        prefix, _, leaf = name.rpartition(".")
        if prefix.endswith("qkv_proj"):
            attn = model.get_submodule(prefix.rpartition(".")[0])
            q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
            for part, chunk in zip("qkv", t.split([q, kv, kv])):
                out[f"{prefix[:-len('qkv_proj')]}{part}_proj.{leaf}"] = chunk.clone()
        elif prefix.endswith("kv_proj"):
            for part, chunk in zip("kv", t.chunk(2)):
                out[f"{prefix[:-len('kv_proj')]}{part}_proj.{leaf}"] = chunk.clone()
        elif prefix.endswith("w13"):
            for part, chunk in zip(("w1", "w3"), t.chunk(2)):
                out[f"{prefix[:-len('w13')]}{part}.{leaf}"] = chunk.clone()
        else:
            out[name] = t.clone()
    return out


@pytest.mark.parametrize("arch, kw", [
    ("decoder", {"activation": "swiglu", "attention": {"num_kv_heads": 2}}),
    ("encoder_decoder", {"activation": "geglu"}),
    ("encoder", {}),
])
def test_checkpoints_with_separate_projections_load_with_identical_logits(arch, kw, tmp_path):
    import attnlab
    from attnlab.io.weights import write_safetensors

    model = tiny(arch, "rotary", **kw)
    legacy = _legacy_state(model)
    assert any(k.endswith("k_proj.weight") for k in legacy) and not any("qkv_proj" in k for k in legacy)
    src, x = ids(2, 6), ids(2, 5)
    with torch.no_grad():
        want = _run(model, arch, x, src=src)
        fresh = build_model(model.config).eval()
        fresh.load_state_dict(legacy)  # torch's loader
        assert torch.equal(_run(fresh, arch, x, src=src), want)
        folder = attnlab.save(model, tmp_path / "old")  # then its tensors as the old version named them
        write_safetensors(legacy, folder / "model.safetensors")
        assert torch.equal(_run(attnlab.load(folder), arch, x, src=src), want)  # attnlab's strict loader

