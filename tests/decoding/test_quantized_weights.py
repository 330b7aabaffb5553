"""Reduced-precision weights for decoding (`attnlab.decoding.quantize`).

The references: a hand computation of the per-channel int8 scales; the products computed in
float64 from the stored weights (every kernel path — the compiled kernels of attnlab.nn.native
and their PyTorch references, oneDNN bf16, torch's bf16 matrix-vector product, the fp32 BLAS
fallback — over row counts and widths on both sides of their switches); the fp32 model (logits within a stated tolerance; identical greedy ids on a
small trained model over a fixed prompt set); the full forward (cached decoding equals it with
quantized weights too); the library call (the command line's --weights prints what it gives).

Tolerances, measured on the trained model below and held with a margin of about 2x: the
logits' error norm is under 1% of the logits' norm for bf16 weights (measured 0.4%) and under
2% for int8 (measured 0.56%). The greedy runs are 30 characters long: over them fp32's margin
between its first and second choice stays above about 2 logits (above 0.4 on the AVX2
kernels, `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`), far above those errors; further
on, the 200-step model reaches text it has not learnt and its own near-ties.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import ModelConfig, build_model
from attnlab.cli.main import main
from attnlab.decoding import QuantizedLinear, generate, quantize_weights
from attnlab.decoding import quantize as quantize_module
from attnlab.decoding.quantize import WEIGHT_FORMATS, int8_per_channel
from attnlab.decoding.runner import CachedRunner, make_runner
from attnlab.nn import native
from attnlab.interop.serialization import save
from attnlab.nn.linear import fixed_layouts, project
from attnlab.tokenizers import Tokenizer

from .helpers import left_padded, tiny

TEXT = ("the quick brown fox jumps over the lazy dog. a stitch in time saves nine. "
        "all that glitters is not gold. to be or not to be, that is the question. "
        "the early bird catches the worm. fortune favours the bold. ")
PROMPTS = ["the quick", "a stitch", "all that", "to be or", "fortune", "the early bird", "the lazy", "gold. "]
LOGIT_TOLERANCE = {"bf16": 0.01, "int8": 0.02}  # error norm / logits' norm
U_BF16 = 2.0 ** -8  # bf16's unit roundoff (8 significant bits): one rounding moves a value by at most this, relative


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train([TEXT], kind="char", special_tokens=["<pad>", "<unk>", "<s>", "</s>"])


@pytest.fixture(scope="module")
def trained(tok):
    """A 2-layer char model trained for 200 steps on TEXT (about 2 s): peaked next-character
    distributions, as a real model's are; widths 64 and 128 take the int8 kernel (K % 32 == 0)."""
    data = torch.tensor(tok.encode(TEXT * 4))
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=64, num_layers=2, num_heads=4, d_ff=128,
                      dropout=0.0, norm_placement="pre", position={"scheme": "rotary", "max_len": 128})
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        starts = torch.randint(0, len(data) - 33, (16,), generator=g)
        x = torch.stack([data[s:s + 33] for s in starts])
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5, f"the fixture did not learn TEXT (loss {loss.item():.2f})"
    return model.eval()


# ---------------------------------------------------------------- the stored weights

def test_per_channel_scales_equal_a_hand_computation():
    w = torch.tensor([[0.5, -1.27, 0.3], [0.0, 0.0, 0.0], [2.54, 1.0, -0.01]])
    q, s = int8_per_channel(w)
    # s[o] = max_k |w[o, k]| / 127 (a zero row: 1); q = round(w / s), ties to even
    torch.testing.assert_close(s, torch.tensor([0.01, 1.0, 0.02]))
    assert q.dtype == torch.int8
    assert q.tolist() == [[50, -127, 30], [0, 0, 0], [127, 50, 0]]
    linear = nn.Linear(3, 3)
    with torch.no_grad():
        linear.weight.copy_(w)
    made = QuantizedLinear.from_linear(linear, "int8")
    assert torch.equal(made.qweight, q) and torch.equal(made.scale, s)
    torch.testing.assert_close(made.weight, q.float() * s[:, None])
    assert torch.equal(made.bias, linear.bias.detach())
    # the error per weight is at most half a step of its row
    w = torch.randn(64, 96)
    q, s = int8_per_channel(w)
    assert q.abs().max() == 127
    assert bool(((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-7).all())


def test_bf16_storage_rounds_each_weight():
    linear = nn.Linear(96, 40)
    made = QuantizedLinear.from_linear(linear, "bf16")
    assert made.qweight.dtype == torch.bfloat16 and made.scale is None
    assert torch.equal(made.weight, linear.weight.detach().bfloat16().float())


def _ideal(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """What the layer's bf16 product computes, in float64: bf16(x) @ stored W^T (+ b), before the
    output rounding."""
    y = x.bfloat16().double() @ layer.qweight.double().t()
    return y + layer.bias.double() if layer.bias is not None else y


def _int8_bound(layer: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """How far the int8 product may be from x @ (Q * s)^T + b in float64: each activation moves
    by at most half its row's int16 step (sx / 2), then a few fp32 roundings."""
    sx = x.abs().amax(dim=1, keepdim=True).double() / 32767
    exact = x.double() @ (layer.qweight.double() * layer.scale.double()[:, None]).t()
    reach = sx / 2 * (layer.qweight.double().abs().sum(1) * layer.scale.double())
    return reach + 1e-6 * (1 + exact.abs())


@pytest.mark.parametrize("weights", ["int8", "bf16"])
@pytest.mark.parametrize("path", ["compiled, native bf16", "compiled", "PyTorch"])
def test_every_kernel_path_computes_the_stated_product(weights, path, monkeypatch):
    """Rows on both sides of BF16_KERNEL_ROWS, widths with and without K % 32 == 0, shapes
    alternating in one process; with and without the compiled kernels (attnlab.nn.native) and
    oneDNN's native bf16; the module's call and a decoding loop's (`inference_layout`, through
    `project`) alike. int8 is the same bits on every path; bf16 within its roundings."""
    if path != "compiled, native bf16":
        monkeypatch.setattr(quantize_module, "_native_bf16", lambda: False)
    if path == "PyTorch":
        monkeypatch.setattr(native, "kernels", lambda: None)
    elif native.kernels() is None:
        pytest.fail("the native kernels did not build here (see the warning): this path is not tested")
    g = torch.Generator().manual_seed(0)
    for K, O in [(64, 33), (96, 7), (40, 16), (128, 130), (32, 1)]:
        linear = nn.Linear(K, O)
        layer = QuantizedLinear.from_linear(linear, weights)
        for rows in (1, 3, 4, 5, 16, 17, 40):
            x = torch.randn(rows, K, generator=g)
            y = layer(x)
            assert y.shape == (rows, O) and y.dtype == torch.float32
            if weights == "int8":
                expected = native.int8_rows_reference(x, layer.qweight, layer.scale, layer.bias)
                assert torch.equal(y, expected), (K, O, rows)
                assert torch.equal(layer(x[-1:]), y[-1:]), "a row alone gives the bits it gives in a batch"
                exact = x.double() @ (layer.qweight.double() * layer.scale.double()[:, None]).t() + layer.bias.double()
                assert bool(((y.double() - exact).abs() <= _int8_bound(layer, x)).all()), (K, O, rows)
            else:
                ideal = _ideal(layer, x)
                product = ideal - layer.bias.double()
                # one bf16 rounding of the product, plus the fp32 sums' own error
                bound = U_BF16 * product.abs() + 1e-5 * (1 + ideal.abs())
                assert bool(((y.double() - ideal).abs() <= bound).all()), (K, O, rows)
            with torch.no_grad(), fixed_layouts(layer):  # a decoding loop's call: the same product
                assert torch.equal(project(layer, x), y), (weights, K, O, rows)


def test_the_cached_bf16_layout_follows_the_stored_weight():
    layer = QuantizedLinear.from_linear(nn.Linear(64, 32), "bf16")
    x = torch.randn(1, 64)
    before = layer(x)
    with torch.no_grad():
        layer.qweight.mul_(2)  # in place: the blocked copy must be remade
    torch.testing.assert_close(layer(x), _ideal(layer, x).float(), atol=1e-4, rtol=2 * U_BF16)
    assert not torch.allclose(layer(x), before)


def test_a_sequence_goes_through_the_same_product():
    layer = QuantizedLinear.from_linear(nn.Linear(64, 24), "int8")
    x = torch.randn(2, 5, 64)
    y = layer(x)
    assert y.shape == (2, 5, 24)
    torch.testing.assert_close(y, layer(x.reshape(10, 64)).view(2, 5, 24), atol=1e-5, rtol=1e-3)


# ---------------------------------------------------------------- the model

def test_the_model_swaps_every_plain_linear_and_keeps_the_embedding_fp32(trained):
    q = quantize_weights(trained, "int8")
    assert all(type(m) is nn.Linear for m in trained.modules() if isinstance(m, (nn.Linear, QuantizedLinear))), \
        "the fp32 model was changed (the default returns a copy)"
    assert not any(type(m) is nn.Linear for m in q.modules())
    assert isinstance(q.head.proj, QuantizedLinear)  # the tied head, quantized as a matrix of its own
    assert q.embed.token.weight.dtype == torch.float32
    torch.testing.assert_close(q.embed.token.weight, trained.embed.token.weight, atol=0, rtol=0)
    same = quantize_weights(trained, "fp32")
    x = torch.tensor([list(TEXT[:40].encode())]) % trained.vocab_size
    with torch.no_grad():
        assert torch.equal(same(x), trained(x)), "fp32 is exact"
    with pytest.raises(ValueError, match="weights must be one of fp32, bf16, int8, got 'int4'"):
        quantize_weights(trained, "int4")


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_logits_within_the_stated_tolerance_of_fp32(trained, tok, weights):
    x = torch.tensor([tok.encode(TEXT[:100])])
    q = quantize_weights(trained, weights)
    with torch.no_grad():
        exact, approx = trained(x), q(x)
    error = ((approx - exact).norm() / exact.norm()).item()
    assert 0 < error < LOGIT_TOLERANCE[weights], error


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_identical_greedy_ids_on_a_trained_model(trained, tok, weights):
    q = quantize_weights(trained, weights)
    for prompt in PROMPTS:
        ids = torch.tensor([tok.encode(prompt)])
        assert torch.equal(generate(q, ids, 30), generate(trained, ids, 30)), prompt
    # a left-padded batch too
    rows = [tok.encode(p) for p in PROMPTS]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = torch.tensor(r), 1
    assert torch.equal(generate(q, ids, 30, attention_mask=mask), generate(trained, ids, 30, attention_mask=mask))


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_cached_decoding_equals_the_full_forward(weights):
    """At every step the cached runner's logits (one row per call: the kernels) equal a full
    forward pass on the prefix (a prompt's many rows: the BLAS fallback) with the same weights."""
    model = quantize_weights(tiny("decoder", "rotary"), weights)  # widths 32 and 64: the kernels
    x, mask = left_padded([6, 3, 1, 5])
    ids, valid = x, mask.bool()
    runner = make_runner(model, use_cache=True, max_len=x.shape[1] + 8)
    assert isinstance(runner, CachedRunner)
    with torch.no_grad():
        logits = runner.start(ids, valid)
        for _ in range(8):
            expected = model(ids, valid)[:, -1]
            torch.testing.assert_close(logits, expected, atol=2e-3, rtol=2e-3)
            token = logits.argmax(-1)
            ids = torch.cat([ids, token[:, None]], 1)
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], 1)
            logits = runner.step(ids, valid)
    assert torch.equal(generate(model, x, 10, attention_mask=mask),
                       generate(model, x, 10, attention_mask=mask, use_cache=False))


@pytest.mark.parametrize("arch", ["encoder_decoder", "rnn_encoder_decoder"])
def test_sequence_to_sequence_models_decode_with_quantized_weights(arch):
    if arch == "rnn_encoder_decoder":
        cfg = ModelConfig(arch=arch, vocab_size=50, d_model=32, dropout=0.0,
                          rnn={"cell": "lstm", "hidden_size": 32, "attention": "additive"})
        model = build_model(cfg).eval()
    else:
        model = tiny(arch, "sinusoidal")
    src, src_mask = left_padded([5, 7, 2])
    src_mask = src_mask.flip(1)  # sources are right-padded
    src = src.flip(1)
    for weights in ("bf16", "int8"):
        q = quantize_weights(model, weights)
        assert any(isinstance(m, QuantizedLinear) for m in q.modules())
        cached = generate(q, src, 8, attention_mask=src_mask, num_beams=2)
        assert torch.equal(cached, generate(q, src, 8, attention_mask=src_mask, num_beams=2, use_cache=False))


# ---------------------------------------------------------------- the command line

def _char_lm(tok):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="decoder", vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                      dropout=0.0, norm_placement="pre", position={"scheme": "rotary", "max_len": 128}, init_std=0.3)
    return build_model(cfg).eval()


def test_the_command_line_flag_decodes_with_the_quantized_model(tmp_path, tok, capsys):
    import argparse

    from attnlab.cli.generate import add_decoding_flags

    parser = argparse.ArgumentParser()
    add_decoding_flags(parser, max_new=1, beams=1)
    flag = next(a for a in parser._actions if a.dest == "weights")
    assert tuple(flag.choices) == WEIGHT_FORMATS and flag.default == "fp32"  # the parser and the library agree
    model = _char_lm(tok)
    save(model, tmp_path / "lm", tokenizer=tok)
    eos = tok.token_to_id("</s>")
    prompt = "the qu"
    ids = torch.tensor([tok.encode(prompt)])
    pad = tok.token_to_id("<pad>")
    for weights in ("int8", "bf16"):
        out = generate(quantize_weights(model, weights), ids, 20, eos_token_id=eos, pad_token_id=pad)
        new = out[0, ids.shape[1]:].tolist()
        new = new[:new.index(eos)] if eos in new else new
        assert main(["generate", str(tmp_path / "lm"), "--prompt", prompt, "--max-new-tokens", "20",
                     "--weights", weights, "--no-stream"]) == 0
        assert capsys.readouterr().out == prompt + tok.decode(new, skip_special_tokens=True) + "\n"
    with pytest.raises(SystemExit) as exit_:  # a usage error exits as argparse does
        main(["generate", str(tmp_path / "lm"), "--prompt", prompt, "--weights", "int4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: argument --weights: invalid choice: 'int4'" in err, err


def test_translate_takes_the_flag(tmp_path, tok, capsys):
    torch.manual_seed(0)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=4,
                      d_ff=64, dropout=0.0, norm_placement="pre", position={"scheme": "learned", "max_len": 64},
                      init_std=0.3, pad_token_id=tok.token_to_id("<pad>"))
    model = build_model(cfg).eval()
    save(model, tmp_path / "mt", tokenizer=tok)
    (tmp_path / "in.txt").write_text("the cat\nto be or not\n")
    outputs = {}
    for weights in ("fp32", "int8"):
        assert main(["translate", str(tmp_path / "mt"), "--input", str(tmp_path / "in.txt"), "--max-new-tokens", "6",
                     "--num-beams", "2", "--quiet", "--weights", weights]) == 0
        outputs[weights] = capsys.readouterr().out
    assert outputs["int8"].count("\n") == 2
    # what the library gives for the same quantized model
    from attnlab.data.objectives import encoder_source

    eos = tok.token_to_id("</s>")
    q = quantize_weights(model, "int8")
    lines = []
    for text in ("the cat", "to be or not"):
        src = torch.tensor([encoder_source(tok, text, special_tokens=True)])
        out = generate(q, src, 6, num_beams=2, eos_token_id=eos, pad_token_id=tok.token_to_id("<pad>"),
                       decoder_start_token_id=tok.token_to_id("<s>"))[0, 1:].tolist()
        lines.append(tok.decode(out[:out.index(eos)] if eos in out else out, skip_special_tokens=True))
    assert outputs["int8"] == "".join(line + "\n" for line in lines)


def test_a_quantized_model_is_not_saved(tmp_path):
    """attnlab.load could not read it back: save refuses it in one line, and writes nothing."""
    from attnlab.interop.serialization import save

    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="decoder", vocab_size=32, d_model=32, num_layers=1, num_heads=2, d_ff=64))
    with pytest.raises(ValueError, match="int8/bf16 decoding weights"):
        save(quantize_weights(model, "int8"), tmp_path / "q")
    assert not (tmp_path / "q").exists()
