import pytest
import torch

import attnlab.nn.kernels.sdpa as sdpa_module
from attnlab import ModelConfig, build_model
from attnlab.inspect.attention_maps import attention_maps, capture_attention, select_modules, stack_layers
from attnlab.inspect.plots import plot_alignment, plot_head_grid
from tests.models.helpers import ids, tiny


def _inputs_recorder(module):
    seen = []

    def hook(mod, args, kwargs):
        seen.append((args, dict(kwargs)))

    return seen, module.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("scheme", ["learned", "rotary", "relative", "alibi", "t5_bias"])
def test_captured_weights_equal_eager_and_outputs_unchanged(scheme):
    model = tiny("encoder_decoder", scheme)
    src, tgt = ids(2, 7), ids(2, 5)
    src_mask = torch.ones(2, 7, dtype=torch.long)
    src_mask[1, :2] = 0
    ref = model(src, tgt, src_mask)
    name = "decoder.layers.1.self_attn"
    module = dict(model.named_modules())[name]
    seen, handle = _inputs_recorder(module)
    with capture_attention(model, names=[name, "decoder.layers.0.cross_attn"]) as rec:
        out = model(src, tgt, src_mask)
    handle.remove()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    args, kwargs = seen[0]
    kwargs["need_weights"] = True
    _, eager = module(*args, **kwargs)  # the eager path, asked directly
    torch.testing.assert_close(rec[name], eager)
    cross = rec["decoder.layers.0.cross_attn"]
    assert cross.shape == (2, 4, 5, 7)
    torch.testing.assert_close(cross.sum(-1), torch.ones(2, 4, 5))
    assert cross[1, :, :, :2].abs().max() == 0  # padding keys get no weight
    assert set(rec.names()) == {name, "decoder.layers.0.cross_attn"}


def test_unchosen_modules_keep_fused_kernel(monkeypatch):
    model = tiny("decoder", "rotary")
    calls = []
    real = sdpa_module.sdpa_attention

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sdpa_module, "sdpa_attention", counting)
    x = ids(2, 6)
    model(x)
    assert len(calls) == 2  # both layers fused without capture
    calls.clear()
    with capture_attention(model, names="layers.0.*") as rec:
        model(x)
    assert len(calls) == 1  # layer 1 still fused, layer 0 eager
    assert rec["layers.0.self_attn"].shape == (2, 4, 6, 6)
    # causal: no weight on the future
    assert torch.triu(rec["layers.0.self_attn"], diagonal=1).abs().max() == 0
    # hooks are gone after the block
    calls.clear()
    model(x)
    assert len(calls) == 2


def test_heads_selection_and_caller_gets_what_it_asked():
    model = tiny("encoder")
    x = ids(1, 5)
    module = model.layers[0].self_attn
    with capture_attention(model, names="layers.0.self_attn", heads=[1, 3]) as rec:
        h = model.embed(x, torch.arange(5)[None])
        out, w = module(h, need_weights=True)
        out2, w2 = module(h)
    assert w is not None and w.shape == (1, 4, 5, 5) and w2 is None
    assert rec.calls("layers.0.self_attn")[0].shape == (1, 2, 5, 5)
    torch.testing.assert_close(rec.calls("layers.0.self_attn")[0], w[:, [1, 3]])


def test_bad_selection_raises():
    model = tiny("decoder")
    with pytest.raises(ValueError, match="matches no attention module"):
        select_modules(model, "decoder.nothing")
    with pytest.raises(ValueError, match="heads"):
        with capture_attention(model, heads=[]):
            pass


def test_recurrent_attention_maps_and_plots(tmp_path):
    cfg = ModelConfig(arch="rnn_encoder_decoder", vocab_size=30, d_model=16, dropout=0.0,
                      rnn={"cell": "gru", "attention": "additive", "hidden_size": 16})
    model = build_model(cfg).eval()
    src, tgt = torch.randint(1, 30, (2, 6)), torch.randint(1, 30, (2, 4))
    maps = attention_maps(model, src, tgt)
    w = maps["attention"]
    assert w.shape == (2, 1, 4, 6)  # one call per decoder step, joined along the target axis
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 4))
    p = plot_alignment(w[0, 0], list("abcdef"), list("wxyz"), tmp_path / "align.png")
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    tmodel = tiny("decoder")
    names, grid = stack_layers(attention_maps(tmodel, ids(1, 5)))
    assert grid.shape == (2, 4, 5, 5)
    p = plot_head_grid(grid, tmp_path / "grid.png", row_names=names)
    assert open(p, "rb").read(4) == b"\x89PNG"
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".tmp")]
