"""attnlab's LoRA on a converted Llama == peft's LoRA on the original: the same adapters copied
across give the same logits, unmerged and merged (random small Llama with GQA, fp32, eval).

Llama keeps q, k, v and gate, up apart; attnlab fuses them (`qkv_proj`, `w13`). peft's adapter
on `q_proj` is attnlab's part `q` of `qkv_proj` (its rows only), on `gate_proj` the part `w1` of
`w13`, on `up_proj` the part `w3`."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from attnlab.interop import from_hf
from attnlab.nn.lora import add_lora, lora_layers, merge_lora
from tests.interop.helpers import real_max_diff, right_padded, single_thread
from tests.parity.test_llama import V, hf_model

pytestmark = pytest.mark.usefixtures(single_thread.__name__)

ATOL = 1e-5
RANK, ALPHA = 4, 12
# peft's module in layer i -> (attnlab's Linear in layer i, part)
PARTS = {"self_attn.q_proj": ("self_attn.qkv_proj", "q"), "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
         "self_attn.v_proj": ("self_attn.qkv_proj", "v"), "self_attn.o_proj": ("self_attn.out_proj", "all"),
         "mlp.gate_proj": ("ffn.w13", "w1"), "mlp.up_proj": ("ffn.w13", "w3"), "mlp.down_proj": ("ffn.w2", "all")}


def _copy_adapters(ours, theirs, zero_b: bool = False) -> int:
    """Draw random A and B (B = 0 if zero_b) for every attnlab adapter, copy them into peft's."""
    g = torch.Generator().manual_seed(3)
    modules = dict(theirs.base_model.model.named_modules())
    copied = 0
    for i in range(2):
        for hf_name, (linear, part) in PARTS.items():
            lora = ours.get_submodule(f"layers.{i}.{linear}")
            if part not in getattr(lora, "rows", {}):
                continue
            other = modules[f"model.layers.{i}.{hf_name}"]
            with torch.no_grad():
                for mine, peft_weight in ((lora.lora_A[part], other.lora_A["default"].weight),
                                          (lora.lora_B[part], other.lora_B["default"].weight)):
                    mine.copy_(torch.randn(mine.shape, generator=g) * (0.0 if zero_b and mine is lora.lora_B[part]
                                                                       else 0.2))
                    assert peft_weight.shape == mine.shape
                    peft_weight.copy_(mine)
            copied += 1
    return copied


@pytest.mark.parametrize("targets", [(["q_proj", "v_proj"], ["q", "v"]),
                                     (["k_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                      ["k", "out_proj", "w1", "w3", "w2"])], ids=["q-v", "k-o-mlp"])
def test_llama_logits_match_peft_unmerged_and_merged(targets):
    theirs_targets, ours_targets = targets
    hf = hf_model("llama-gqa-untied")
    ours = from_hf(hf)
    add_lora(ours, rank=RANK, alpha=ALPHA, target_modules=ours_targets)
    theirs = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=theirs_targets,
                                           lora_dropout=0.0)).eval()
    ids, mask = right_padded([9, 5, 2], V)
    call_theirs = lambda m: m(input_ids=ids, attention_mask=mask).logits  # noqa: E731
    with torch.no_grad():
        start = ours(ids, mask)
        assert real_max_diff(start, call_theirs(theirs), mask) <= ATOL
    copied = _copy_adapters(ours, theirs)
    assert copied == sum(len(m.rows) for m in lora_layers(ours).values()) == 2 * len(ours_targets)
    with torch.no_grad():
        got = ours(ids, mask)
        assert real_max_diff(got, start, mask) > 1e-3  # the adapters do change the outputs
        assert real_max_diff(got, call_theirs(theirs), mask) <= ATOL
        merge_lora(ours)
        assert real_max_diff(ours(ids, mask), call_theirs(theirs.merge_and_unload()), mask) <= ATOL


def test_a_lora_fine_tune_follows_peft_step_by_step():
    # the same SGD steps on the same next-token loss, from the same adapters (B = 0): the same model
    hf = hf_model("mistral-window-3")
    ours = from_hf(hf)
    add_lora(ours, rank=RANK, alpha=ALPHA, target_modules=["q", "v", "w1", "w2"])
    theirs = get_peft_model(hf, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                           target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])).eval()
    _copy_adapters(ours, theirs, zero_b=True)
    ids, mask = right_padded([9, 7, 4], V, seed=2)
    labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)

    def step(model, logits, optimizer):
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    trainable = lambda m: [p for p in m.parameters() if p.requires_grad]  # noqa: E731
    assert sum(p.numel() for p in trainable(ours)) == sum(p.numel() for p in trainable(theirs))
    opt_ours, opt_theirs = torch.optim.SGD(trainable(ours), lr=0.5), torch.optim.SGD(trainable(theirs), lr=0.5)
    losses = [(step(ours, ours(ids, mask), opt_ours),
               step(theirs, theirs(input_ids=ids, attention_mask=mask).logits, opt_theirs)) for _ in range(4)]
    assert losses[-1][0] < losses[0][0] - 1e-3  # it did learn
    assert all(abs(a - b) <= ATOL for a, b in losses)
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).logits
        assert real_max_diff(ours(ids, mask), want, mask) <= 1e-4
