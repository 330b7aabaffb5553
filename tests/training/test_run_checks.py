"""check_run: every check between two sections of a run config, refused on load by field
(attnlab.training.run_checks)."""

import pytest

from attnlab import presets
from attnlab.config import ConfigError
from attnlab.nn.kernels import KERNELS
from attnlab.training.config import DataConfig, ParallelConfig, TrainConfig
from attnlab.training.data.objectives import OBJECTIVES
from attnlab.training.run_checks import check_run


def test_packing_against_the_kernel_and_the_memory():
    with pytest.raises(ConfigError, match=r"^data\.pack: 'document_masked' needs an attention kernel that takes a "
                                          r"dense mask .*attention\.kernel='local_block'"):
        TrainConfig.from_dict({"model": {"preset": "tiny-decoder", "attention": {"kernel": "local_block"}},
                               "data": {"pack": "document_masked"}})
    memory = {"preset": "tiny-decoder", "memory_len": 8, "position": {"scheme": "rotary"}}
    with pytest.raises(ConfigError, match=r"^data\.pack: 'pad' makes rows, but model\.memory_len=8"):
        TrainConfig.from_dict({"model": memory, "data": {"pack": "pad"}})
    # a config built in Python goes through the same check
    with pytest.raises(ConfigError, match=r"^data\.pack: 'document_masked' needs"):
        TrainConfig(model=presets.get("tiny-decoder", attention={"kernel": "sliding_window"}),
                    data=DataConfig(pack="document_masked", seq_len=64))


@pytest.mark.parametrize("scheme", ["learned", "binary"])
def test_pairs_must_fit_a_position_table(scheme):
    """A side of a seq2seq pair is max_pair_len + 1 tokens (EOS, or the start token): 64 does not
    fit a table of 64 (it failed at the first step); left out, max_pair_len fits the table."""
    model = {"preset": "tiny-encoder-decoder", "position": {"scheme": scheme, "max_len": 64}}
    with pytest.raises(ConfigError, match=r"^data\.max_pair_len: rows of up to 65 tokens do not fit "
                                          rf"{scheme} positions of model\.position\.max_len=64"):
        TrainConfig.from_dict({"model": model, "data": {"objective": "seq2seq", "max_pair_len": 64}})
    for objective in ("seq2seq", "pairs_lm"):
        data = TrainConfig.from_dict({"model": model, "data": {"objective": objective}}).data
        assert max(n for n in OBJECTIVES[objective].row_lengths(data) if n) <= 64
        longer = DataConfig(objective=objective, max_pair_len=data.max_pair_len + 1)
        assert max(n for n in OBJECTIVES[objective].row_lengths(longer) if n) > 64  # the longest that fits
    assert TrainConfig.from_dict({"data": {"objective": "seq2seq"}}).data.max_pair_len == 63  # the default run
    wide = {"preset": "tiny-encoder-decoder", "position": {"scheme": "rotary"}}
    assert TrainConfig.from_dict({"model": wide, "data": {"objective": "seq2seq"}}).data.max_pair_len == 64


def test_every_window_objective_is_checked_against_the_table():
    model = {"preset": "tiny-encoder-decoder", "position": {"scheme": "learned", "max_len": 64}}
    with pytest.raises(ConfigError, match=r"^data\.seq_len: rows of up to 80 tokens"):
        TrainConfig.from_dict({"model": model, "data": {"objective": "encoder_decoder_lm", "seq_len": 80}})


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_kernel_against_tensor_parallel(name):
    """Each kernel as its `supports.tensor_parallel` says: refused on load under tp > 1, by field."""
    model = {"preset": "tiny-encoder", "attention": {"kernel": name}}
    data = {"objective": "masked_lm"}
    if KERNELS[name].supports.tensor_parallel:
        TrainConfig.from_dict({"model": model, "data": data, "parallel": {"tp": 2}})
        return
    with pytest.raises(ConfigError, match=rf"^parallel\.tp: 2: tensor parallel does not support "
                                          rf"attention\.kernel='{name}'; use auto, eager, sdpa"):
        TrainConfig.from_dict({"model": model, "data": data, "parallel": {"tp": 2}})
    TrainConfig.from_dict({"model": model, "data": data, "parallel": {"pp": 2}})  # whole heads per rank


def test_a_kernel_that_picks_tokens_by_id_against_pipeline_parallel():
    by_id = {"preset": "tiny-decoder", "num_layers": 2,
             "attention": {"kernel": "longformer", "kernel_options": {"window": 4, "global_token_id": 1}}}
    with pytest.raises(ConfigError, match=r"^parallel\.pp: 2: pipeline parallel \(pp=2\) does not support "
                                          r"attention\.kernel='longformer' with these options: it picks tokens by id"):
        TrainConfig.from_dict({"model": by_id, "parallel": {"pp": 2}})
    TrainConfig.from_dict({"model": by_id})  # one process: every layer sees the ids
    positions = {**by_id, "attention": {"kernel": "longformer", "kernel_options": {"global_positions": [0]}}}
    config = TrainConfig.from_dict({"model": positions, "parallel": {"pp": 2}})  # by position: every stage knows
    config.parallel = ParallelConfig(pp=2)
    config.model = config.model.replace(attention={"kernel": "longformer",
                                                   "kernel_options": {"window": 4, "global_token_id": 1}})
    with pytest.raises(ConfigError, match=r"^parallel\.pp: 2:"):  # check_run on its own, as the setup calls it
        check_run(config)


@pytest.mark.parametrize("sections, message", [
    ({"parallel": {"tp": 2}, "train": {"precision": "fp16"}},
     "train.precision: 'fp16' (a loss scaler per rank) is not supported with parallel.tp=2; use bf16 or fp32"),
    ({"parallel": {"tp": 2}, "model": {"preset": "tiny-decoder", "memory_len": 8, "position": {"scheme": "rotary"}}},
     "model.memory_len: 8 (a segment memory) is not supported with parallel.tp=2"),
    ({"parallel": {"pp": 2, "micro_batches": 3}, "data": {"batch_size": 4}},
     "parallel.micro_batches: 3 does not divide the 4 rows of a step"),
])
def test_what_a_layout_asks_of_the_other_sections_is_refused_on_load(sections, message):
    """Without the number of processes: refused when the config is read, not when N ranks start."""
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(sections)
    assert str(info.value).startswith(message)
    TrainConfig.from_dict({**sections, "parallel": {}})  # one process: nothing to refuse
