"""A post-LN EncoderDecoder equals torch.nn.Transformer with copied weights."""

import pytest
import torch
from torch import nn

from attnlab import ModelConfig, build_model
from attnlab.nn.masks import causal_mask

D, H, FF, L, V = 32, 4, 64, 2, 40


def _copy_attention(ref: nn.MultiheadAttention, ours) -> None:
    """torch's in_proj is q | k | v fused: ours too (self-attention), or q and a fused k | v (cross)."""
    wq, wkv = ref.in_proj_weight.split([D, 2 * D])
    bq, bkv = ref.in_proj_bias.split([D, 2 * D])
    if ours.qkv_proj is not None:
        pairs = [(ours.qkv_proj, ref.in_proj_weight, ref.in_proj_bias)]
    else:
        pairs = [(ours.q_proj, wq, bq), (ours.kv_proj, wkv, bkv)]
    for proj, w, b in pairs + [(ours.out_proj, ref.out_proj.weight, ref.out_proj.bias)]:
        proj.weight.copy_(w)
        proj.bias.copy_(b)


def _copy_layer(ref, ours) -> None:
    _copy_attention(ref.self_attn, ours.self_attn)
    ours.ffn.w1.load_state_dict(ref.linear1.state_dict())
    ours.ffn.w2.load_state_dict(ref.linear2.state_dict())
    ours.self_attn_block.norm.load_state_dict(ref.norm1.state_dict())
    if hasattr(ref, "multihead_attn"):
        _copy_attention(ref.multihead_attn, ours.cross_attn)
        ours.cross_attn_block.norm.load_state_dict(ref.norm2.state_dict())
        ours.ffn_block.norm.load_state_dict(ref.norm3.state_dict())
    else:
        ours.ffn_block.norm.load_state_dict(ref.norm2.state_dict())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_decoder_equals_torch_transformer(activation):
    ref = nn.Transformer(D, H, L, L, FF, dropout=0.0, activation=activation, batch_first=True).eval()
    for p in ref.parameters():  # norms start at (1, 0): make them matter
        nn.init.normal_(p, std=0.3)
    cfg = ModelConfig(arch="encoder_decoder", vocab_size=V, d_model=D, num_layers=L, num_heads=H, d_ff=FF,
                      activation=activation, dropout=0.0, norm_placement="post", final_norm=True,
                      position={"scheme": "sinusoidal"}, embedding_scale=True)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for ref_layer, layer in zip(ref.encoder.layers, model.encoder.layers):
            _copy_layer(ref_layer, layer)
        for ref_layer, layer in zip(ref.decoder.layers, model.decoder.layers):
            _copy_layer(ref_layer, layer)
        model.encoder.final_norm.load_state_dict(ref.encoder.norm.state_dict())
        model.decoder.final_norm.load_state_dict(ref.decoder.norm.state_dict())

    src, tgt = torch.randint(1, V, (3, 9)), torch.randint(1, V, (3, 7))
    src_mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3, [1] * 4 + [0] * 5])
    tgt_mask = torch.tensor([[1] * 7, [1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        ours = model(src, tgt, src_mask, tgt_mask)
        # the reference: same embeddings and output projection around nn.Transformer
        pos = lambda x: torch.arange(x.shape[1])[None]  # noqa: E731
        out = ref(model.encoder.embed(src, pos(src)), model.decoder.embed(tgt, pos(tgt)),
                  tgt_mask=~causal_mask(7), src_key_padding_mask=~src_mask.bool(),
                  memory_key_padding_mask=~src_mask.bool(), tgt_key_padding_mask=~tgt_mask.bool())
        expected = model.decoder.head(out)
    real = tgt_mask.bool()
    torch.testing.assert_close(ours[real], expected[real], atol=1e-5, rtol=1e-5)
