"""What the Llama-family converter refuses, by the name of the Hugging Face field or the attnlab
tensor, and what it reads from configs it accepts."""

import pytest

from attnlab import ModelConfig, build_model
from attnlab.interop import from_hf, to_hf
from attnlab.interop.llama import LLAMA, MISTRAL, QWEN2

SMALL = dict(model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
             num_attention_heads=4)


@pytest.mark.parametrize("field, value, message", [
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
     r"rope_parameters\.rope_type='yarn' is not supported"),
    ("rope_parameters", {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]},
     r"rope_parameters\.rope_type='longrope' is not supported"),
    ("rope_scaling", {"type": "dynamic", "factor": 2.0}, r"rope_scaling='dynamic' is not supported"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, r"rope_scaling='llama3' needs low_freq_factor, "
                                                            r"high_freq_factor, original_max_position_embeddings"),
    ("partial_rotary_factor", 0.5, r"partial_rotary_factor=0\.5 is not supported"),
    ("hidden_act", "gelu_fast", r"hidden_act='gelu_fast' is not one of"),
    ("pretraining_tp", 2, r"pretraining_tp=2 is not supported"),
])
def test_llama_options_attnlab_does_not_compute_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=f"^Llama config: {message}"):
        LLAMA.config_from_hf({**SMALL, field: value}, "LlamaForCausalLM")


def test_qwen2_sliding_window_layers_are_refused():
    hf = {**SMALL, "model_type": "qwen2", "layer_types": ["sliding_attention"]}
    with pytest.raises(ValueError, match=r"^Qwen2 config: use_sliding_window / layer_types"):
        QWEN2.config_from_hf(hf, "Qwen2ForCausalLM")
    with pytest.raises(ValueError, match="use_sliding_window"):
        QWEN2.config_from_hf({**hf, "layer_types": None, "use_sliding_window": True}, "Qwen2ForCausalLM")


def test_mistral_window_must_be_positive():
    with pytest.raises(ValueError, match=r"^Mistral config: sliding_window=0 is not a positive integer"):
        MISTRAL.config_from_hf({**SMALL, "model_type": "mistral", "sliding_window": 0}, "MistralForCausalLM")
    cfg = MISTRAL.config_from_hf({**SMALL, "model_type": "mistral", "sliding_window": 5}, "MistralForCausalLM")
    assert cfg.attention.kernel_options.window == 4  # Mistral's W keys, itself included: attnlab's window W - 1


def test_a_model_type_that_disagrees_with_the_architecture_is_refused():
    import torch

    with pytest.raises(ValueError, match=r"model_type='qwen2' does not match architecture 'LlamaForCausalLM'"):
        from attnlab.interop.api import from_state

        from_state({**SMALL, "model_type": "qwen2"}, "LlamaForCausalLM", {"x": torch.zeros(1)})


def _rotary(**kw):
    base = dict(arch="decoder", vocab_size=50, d_model=32, num_heads=4, num_layers=1, d_ff=48, activation="swiglu",
                norm="rmsnorm", norm_placement="pre", ffn_bias=False, dropout=0.0, position={"scheme": "rotary"},
                attention={"bias": False})
    return ModelConfig(**{**base, **kw})


def test_export_refuses_what_llama_cannot_express_naming_every_field():
    cfg = _rotary(position={"scheme": "rotary", "rotary_dim": 4}, embedding_scale=True)
    with pytest.raises(ValueError, match=r"Llama model: position\.rotary_dim=4 \(needs None or 8\); "
                                         r"embedding_scale=True"):
        to_hf(build_model(cfg))
    with pytest.raises(ValueError, match=r"Qwen2 model: .*attention\.bias=False \(needs True\)"):
        to_hf(build_model(_rotary()), "qwen2")


def test_export_picks_the_family_from_the_config():
    assert LLAMA.matches(_rotary()) and not QWEN2.matches(_rotary()) and not MISTRAL.matches(_rotary())
    qwen2_like = _rotary(attention={"bias": True})
    assert QWEN2.matches(qwen2_like) and not LLAMA.matches(qwen2_like)
    windowed = _rotary(attention={"bias": False, "kernel": "sliding_window", "kernel_options": {"window": 7}})
    assert MISTRAL.matches(windowed) and not LLAMA.matches(windowed)
    assert to_hf(build_model(windowed)).config.sliding_window == 8
    gpt2_like = _rotary(norm="layernorm")  # another decoder: GPT-2's refusal names what it cannot express
    assert not any(c.matches(gpt2_like) for c in (LLAMA, MISTRAL, QWEN2))
    with pytest.raises(ValueError, match="GPT-2 model"):
        to_hf(build_model(gpt2_like))


def test_from_hf_folder_refuses_rope_scaling_before_reading_weights(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "architectures": ["LlamaForCausalLM"],
                                                      "rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="rope_scaling='dynamic' is not supported"):
        from_hf(tmp_path)


def test_older_rope_scaling_maps_to_rotary_scaling():
    cfg = LLAMA.config_from_hf({**SMALL, "rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 4.0}},
                               "LlamaForCausalLM")
    assert (cfg.position.rotary_base, cfg.position.rotary_scaling) == (500.0, {"type": "linear", "factor": 4.0})


def test_convert_and_init_from_a_llama_folder(tmp_path):
    # a Hugging Face folder with its tokenizer.json -> `attnlab convert` -> the same logits; a run's
    # init_from reads the same config from the folder
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from attnlab import load
    from attnlab.cli.main import main
    from attnlab.training.setup.start import read_init_config
    from tests.interop.helpers import randomize, real_max_diff

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the cat sat on the mat"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=40,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   bos_token_id=None, eos_token_id=0)
    hf = randomize(transformers.LlamaForCausalLM(cfg))
    hf.save_pretrained(tmp_path / "hf")
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ours")]) == 0
    model, tokenizer = load(tmp_path / "ours", with_tokenizer=True)
    ids = torch.tensor([tokenizer.encode("the cat sat")])
    with torch.no_grad():
        assert real_max_diff(model(ids), hf(input_ids=ids).logits) <= 1e-5
    assert read_init_config(tmp_path / "hf") == model.config
