"""The family registry: every arch a config accepts has a family and the reverse; each family's
fused batch loss equals the cross-entropy of the model's full forward pass (the reference: logits
then torch's cross_entropy); the data a family declares agrees with the code that reads it."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.config.families import FAMILY_TRAITS
from attnlab.config.validate import ConfigError
from attnlab.data.objectives import IGNORE
from attnlab.models import VisionConfig, build_model
from attnlab.models.families import FAMILIES, family

SMALL = dict(vocab_size=40, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0, pad_token_id=0)


def test_every_config_arch_has_a_family_and_every_arch_family_a_config_line():
    arch_families = {name for name, f in FAMILIES.items() if f.config_type is None}
    assert arch_families == set(FAMILY_TRAITS)
    for name in FAMILY_TRAITS:
        assert family(name).traits is FAMILY_TRAITS[name]
        assert family(ModelConfig(arch=name, **SMALL)).name == name


def test_a_vision_config_finds_the_vision_family_and_an_unknown_arch_names_the_known_ones():
    assert family(VisionConfig()).name == "vision"
    with pytest.raises(ValueError, match=r"^arch 'gpt' names no model family; known: decoder, encoder, "
                                         r"encoder_decoder, rnn_encoder_decoder, vision$"):
        family("gpt")
    with pytest.raises(ValueError, match="known: decoder"):
        family(object())


def test_the_config_takes_the_heads_the_traits_list_and_refuses_the_others():
    heads = ("none", "lm", "mlm", "classification", "token_classification", "regression")
    for arch, traits in FAMILY_TRAITS.items():
        assert ModelConfig(arch=arch, **SMALL).head == traits.heads[0]
        for head in heads:
            if head in traits.heads:
                ModelConfig(arch=arch, head=head, **SMALL)
            else:
                with pytest.raises(ConfigError, match="^head: "):
                    ModelConfig(arch=arch, head=head, **SMALL)


def test_the_hugging_face_model_types_are_those_the_converters_handle():
    from attnlab.interop.families import FAMILIES as CONVERTERS

    declared = [t for f in FAMILIES.values() for t in f.hf_model_types]
    assert sorted(declared) == sorted(m.MODEL_TYPE for m in CONVERTERS)  # each type in one family only
    for converter in CONVERTERS:
        owner = next(f for f in FAMILIES.values() if converter.MODEL_TYPE in f.hf_model_types)
        others = [name for name in FAMILY_TRAITS if name != owner.name]
        assert not any(converter.matches(ModelConfig(arch=name, **SMALL)) for name in others)
    from attnlab.interop import bert, gpt2

    assert gpt2.matches(ModelConfig(arch="decoder", **SMALL)) and bert.matches(ModelConfig(arch="encoder", **SMALL))


def _batch(arch: str, g: torch.Generator) -> dict:
    ids = torch.randint(1, 40, (3, 7), generator=g)
    labels = torch.randint(1, 40, (3, 7), generator=g)
    labels[0, :2] = IGNORE  # rows that take no loss
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[2, 5:] = 0
    if FAMILY_TRAITS[arch].has_source:
        return {"src_ids": ids, "src_mask": mask, "tgt_ids": torch.randint(1, 40, (3, 7), generator=g),
                "labels": labels}
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("arch, head", [("decoder", "lm"), ("encoder", "mlm"), ("encoder_decoder", "lm"),
                                        ("rnn_encoder_decoder", "lm"), ("decoder", "token_classification")])
def test_the_fused_batch_loss_is_the_cross_entropy_of_the_full_forward(arch, head):
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, head=head, **SMALL)).eval()
    batch = _batch(arch, torch.Generator().manual_seed(1))
    if head == "token_classification":
        batch["labels"] = torch.where(batch["labels"] != IGNORE, batch["labels"] % 2, IGNORE)
    if "src_ids" in batch:
        logits = model(batch["src_ids"], batch["tgt_ids"], src_mask=batch["src_mask"])
    else:
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    want = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)
    got = family(model.config).batch_loss(model, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(FAMILY_TRAITS))
def test_a_batch_of_the_wrong_side_is_refused_naming_what_the_family_reads(arch):
    model = build_model(ModelConfig(arch=arch, **SMALL))
    other = "decoder" if FAMILY_TRAITS[arch].has_source else "encoder_decoder"
    with pytest.raises(ValueError, match=f"needs a batch with {family(arch).first_input}"):
        family(arch).batch_loss(model, _batch(other, torch.Generator().manual_seed(0)))


def test_the_stage_inputs_are_what_the_family_features_read():
    """Each declared stage input, added to a batch without it, changes the loss (the features
    read it); a target mask of ones is the exception (it hides nothing)."""
    extra = {"prefix_lengths": torch.tensor([3, 2, 4]), "document_ids": torch.tensor([[0] * 3 + [1] * 4] * 3),
             "token_type_ids": torch.tensor([[0] * 4 + [1] * 3] * 3), "tgt_mask": torch.ones(3, 7, dtype=torch.long)}
    for name, own in FAMILIES.items():
        if own.stage_inputs is None:
            continue
        torch.manual_seed(0)
        segments = dict(type_vocab_size=2, head="mlm") if name == "encoder" else {}
        model = build_model(ModelConfig(arch=name, **segments, **SMALL)).eval()
        batch = {**_batch(name, torch.Generator().manual_seed(2)), **extra}
        assert own.first_input in batch and set(own.stage_inputs) <= set(batch)
        for key in set(own.stage_inputs) - {"tgt_ids", "tgt_mask"}:
            without = {k: v for k, v in batch.items() if k in own.stage_inputs and k != key}
            without.update({own.first_input: batch[own.first_input], "labels": batch["labels"]})
            if key != "attention_mask" and "attention_mask" in without:
                del without["attention_mask"]  # prefix_lengths and document_ids each alone
            if key != "tgt_ids" and "tgt_ids" in own.stage_inputs:
                without["tgt_ids"] = batch["tgt_ids"]
            for other in ("prefix_lengths", "document_ids"):
                if other != key:
                    without.pop(other, None)
            loss = own.batch_loss(model, without)
            assert not torch.equal(own.batch_loss(model, {**without, key: batch[key]}), loss), (name, key)


def test_stacks_and_decoder_layers_follow_the_config():
    cfg = ModelConfig(arch="encoder_decoder", num_decoder_layers=3, **SMALL)
    assert family(cfg).stacks(cfg) == (("encoder.", 2), ("decoder.", 3))
    assert family(cfg).decoder_layers(cfg) == 3 and family(cfg).head_prefix(cfg) == "decoder.head."
    rnn = ModelConfig(arch="rnn_encoder_decoder", **SMALL)
    assert family(rnn).stacks(rnn) == () and family(rnn).decoder_layers(rnn) == 0
    model = build_model(cfg)
    for prefix, layers in family(cfg).stacks(cfg):
        assert len(model.get_submodule(prefix + "layers")) == layers
