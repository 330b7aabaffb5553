"""attnlab's LoRA == peft's on converted Hugging Face models: the same adapter weights copied
across give the same outputs, unmerged and merged (random small GPT-2 and BERT, fp32, eval).

GPT-2 keeps q, k, v in one fused `c_attn` (a Conv1D) as attnlab keeps them in `qkv_proj`: peft's
adapter over the whole of it is attnlab's `qkv_proj` target. BERT has `query`, `key`, `value`
apart: peft's adapter on `query` is attnlab's part `q` of the fused `qkv_proj` (its rows only)."""

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

from attnlab.interop import from_hf
from attnlab.nn.lora import LoraLinear, add_lora, lora_layers, merge_lora
from tests.interop.helpers import randomize, real_max_diff, right_padded, single_thread

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

ATOL = 1e-5
RANK, ALPHA = 4, 12  # scaling alpha / r = 3 in both

# attnlab's name in layer i -> peft's module name in the wrapped Hugging Face model, per family
GPT2 = {"self_attn.qkv_proj": "transformer.h.{i}.attn.c_attn", "self_attn.out_proj": "transformer.h.{i}.attn.c_proj",
        "ffn.w1": "transformer.h.{i}.mlp.c_fc", "ffn.w2": "transformer.h.{i}.mlp.c_proj"}
BERT = {"self_attn.q": "encoder.layer.{i}.attention.self.query", "self_attn.k": "encoder.layer.{i}.attention.self.key",
        "self_attn.v": "encoder.layer.{i}.attention.self.value",
        "self_attn.out_proj": "encoder.layer.{i}.attention.output.dense",
        "ffn.w1": "encoder.layer.{i}.intermediate.dense", "ffn.w2": "encoder.layer.{i}.output.dense"}


def _copy_adapters(ours, peft_model, names: dict[str, str], layers: int) -> int:
    """Draw random A and B for every attnlab adapter and copy them into peft's; returns how many."""
    g = torch.Generator().manual_seed(3)
    peft_modules = dict(peft_model.base_model.model.named_modules())
    copied = 0
    for i in range(layers):
        for ours_name, hf_name in names.items():
            linear_name, _, part = ours_name.rpartition(".")
            if part in "qkv":  # a part of the fused qkv_proj
                lora = ours.get_submodule(f"layers.{i}.{linear_name}.qkv_proj")
            else:
                lora, part = ours.get_submodule(f"layers.{i}.{ours_name}"), "all"
            if not isinstance(lora, LoraLinear) or part not in lora.rows:
                continue
            theirs = peft_modules[hf_name.format(i=i)]
            with torch.no_grad():
                for mine, other in ((lora.lora_A[part], theirs.lora_A["default"].weight),
                                    (lora.lora_B[part], theirs.lora_B["default"].weight)):
                    mine.copy_(torch.randn(mine.shape, generator=g) * 0.2)
                    assert other.shape == mine.shape
                    other.copy_(mine)
            copied += 1
    return copied


def _check(ours, peft_model, names: dict[str, str], call_ours, call_peft, mask) -> None:
    """Equal with B = 0 on both sides; equal with the same random adapters; equal merged."""
    with torch.no_grad():
        start = call_ours(ours)
        assert real_max_diff(start, call_peft(peft_model), mask) <= ATOL
    copied = _copy_adapters(ours, peft_model, names, layers=2)
    assert copied == sum(len(m.rows) for m in lora_layers(ours).values())
    with torch.no_grad():
        got = call_ours(ours)
        assert real_max_diff(got, start, mask) > 1e-3  # the adapters do change the outputs
        assert real_max_diff(got, call_peft(peft_model), mask) <= ATOL
        merge_lora(ours)
        merged_theirs = peft_model.merge_and_unload()
        assert real_max_diff(call_ours(ours), call_peft(merged_theirs), mask) <= ATOL
        assert real_max_diff(call_ours(ours), got, mask) <= ATOL


@pytest.mark.parametrize("targets", [(["c_attn", "c_proj", "c_fc"], ["qkv_proj", "out_proj", "w1", "w2"]),
                                     (["c_attn"], ["qkv_proj"])], ids=["all", "fused-qkv"])
def test_gpt2_logits_match_peft_unmerged_and_merged(targets):
    theirs_targets, ours_targets = targets
    cfg = transformers.GPT2Config(vocab_size=61, n_embd=48, n_head=3, n_layer=2, n_positions=32, bos_token_id=0,
                                  eos_token_id=0)
    hf = randomize(transformers.GPT2LMHeadModel(cfg))
    ours = from_hf(hf).eval()
    add_lora(ours, rank=RANK, alpha=ALPHA, target_modules=ours_targets)
    peft_model = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=theirs_targets,
                                               lora_dropout=0.0, fan_in_fan_out=True)).eval()
    ids, mask = right_padded([9, 5, 2], 61)
    call_ours = lambda m: m(ids, mask)  # noqa: E731
    call_peft = lambda m: m(input_ids=ids, attention_mask=mask).logits  # noqa: E731
    assert len(lora_layers(ours)) == 2 * len(ours_targets)
    _check(ours, peft_model, GPT2, call_ours, call_peft, mask)


@pytest.mark.parametrize("targets", [(["query", "value"], ["q", "v"]),
                                     (["key", "attention.output.dense", "intermediate.dense", "layer.0.output.dense"],
                                      ["k", "out_proj", "w1", "layers.0.ffn.w2"])], ids=["q-v", "k-out-ffn"])
def test_bert_hidden_states_match_peft_with_q_k_v_as_parts_of_the_fused_projection(targets):
    theirs_targets, ours_targets = targets
    cfg = transformers.BertConfig(vocab_size=57, max_position_embeddings=32, hidden_size=48, num_attention_heads=3,
                                  num_hidden_layers=2, intermediate_size=40)
    hf = randomize(transformers.BertModel(cfg))
    ours = from_hf(hf).eval()
    add_lora(ours, rank=RANK, alpha=ALPHA, target_modules=ours_targets)
    peft_model = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=theirs_targets,
                                               lora_dropout=0.0)).eval()
    ids, mask = right_padded([8, 3, 6], 57)
    call_ours = lambda m: m(ids, mask)  # noqa: E731
    call_peft = lambda m: m(input_ids=ids, attention_mask=mask).last_hidden_state  # noqa: E731
    assert sum(len(m.rows) for m in lora_layers(ours).values()) == (4 if ours_targets == ["q", "v"] else 7)
    _check(ours, peft_model, BERT, call_ours, call_peft, mask)
