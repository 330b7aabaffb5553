"""Where a pretraining run starts: a model built from `config.model`, or the weights named by
`model.init_from` with the tokenizer that comes with them.

    model.init_from      read with
    attnlab.save folder  attnlab.load (config.json with "arch", model.safetensors, tokenizer.json)
    run folder           attnlab.load: the best checkpoint of an `attnlab train` run + its tokenizer.json
    Hugging Face folder  attnlab.load -> attnlab.from_hf (GPT-2, BERT, BART, Marian, T5), its tokenizer
                         (tokenizer.json, vocab.json + merges.txt, or vocab.txt)
    hf:NAME[@REVISION]   the Hub model's snapshot folder in huggingface_hub's cache (downloaded there
                         when online, the cache alone with HF_HUB_OFFLINE=1; attnlab.interop.hub),
                         then read as a Hugging Face folder

`resolve_init_from(config)` reads the folder's config.json alone (no weights) into the run
config's model section, so that `attnlab train --print-config` and OUT/config.json show the model
the run trains rather than the defaults the section would otherwise hold.

With init_from the data's tokenizer section is not used: the run tokenises with the model's own
tokenizer (saved as OUT/tokenizer.json). `model.add_special_tokens` appends tokens the model does
not know yet (GPT's `[START]`, `[DELIM]`, `[EXTRACT]` for fine-tuning on structured inputs,
Radford et al. 2018, sec. 3.3) to the tokenizer and grows the token embedding (and the tied or
untied output head) by one row each, initialised to the mean of the existing rows: a new token
starts as the "average token", which keeps the first logits and losses close to the pretrained
model's (Hewitt 2021, "Initializing new word embeddings for pretrained language models").

Under pipeline parallel (parallel.pp > 1) the model is built on the meta device (names and
shapes, no memory) with a `stage_source` (`StageSource`): the random state its initial weights are
drawn from, or the model.safetensors of init_from (an attnlab.save folder or a run's checkpoint);
each rank then materialises its own stage from it (attnlab.parallel.materialise), so that no rank
holds the whole model. A Hugging Face folder or Hub model, or add_special_tokens that grows the
vocabulary, is read whole first (its names must be converted) and cut later.

With a `lora` section the Trainer wraps the model with adapters after this (attnlab.training.setup.adapters);
here its target_modules are checked against the model before any data is prepared (a pattern that
matches nothing is a ConfigError naming it), and a run with `lora` but no init_from is warned
about: its base weights would stay at their random initialisation.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.io.files import read_json
from attnlab.training.setup.adapters import check_lora_targets
from attnlab.training.config import TrainConfig
from attnlab.training.config_resolve import Resolved, apply_objective, objective_fields
from attnlab.training.data.batches import DataPipeline
from attnlab.training.tasks.pretrain import PretrainTask


def pretrain_setup(config: TrainConfig, out: Path, *, pipeline: DataPipeline | None = None, model: nn.Module | None = None,
                   show_progress: bool = True, log: Callable[[str], None] = print) -> tuple[PretrainTask, nn.Module]:
    """The task of `config.data` and the model to train on it (module docstring). A pipeline
    built here has not drawn a batch yet: the Trainer first checks that its batches fit in memory
    (attnlab.training.setup.memory), then draws them (`DataPipeline.check_batches`).

    Raises:
        ValueError: init_from is not a model folder, or the pretrained model does not fit the objective.
    """
    tokenizer = None
    init_from = config.model.init_from
    pipelined = config.parallel.pp > 1
    if model is None and init_from and pipelined:  # only the stage's tensors are read, by each rank
        folder = _init_folder(init_from)
        weights = _weights_file(folder) if not config.model.add_special_tokens else None
        if weights is not None:
            tokenizer = load_tokenizer(init_from, folder)
            with torch.device("meta"):
                model = _build(read_init_config(init_from))
            model.stage_source = StageSource(weights=weights)
            log(f"model.init_from: {init_from} ({model.config.arch}, vocabulary {model.config.vocab_size}; each "
                "pipeline stage reads its own tensors)")
    if model is None and init_from:
        folder = _init_folder(init_from)
        model, tokenizer = load_init(init_from, folder=folder)
        if config.model.add_special_tokens:
            tokenizer, model = add_special_tokens(tokenizer, model, list(config.model.add_special_tokens))
        where = f"{init_from} (commit {folder.name})" if str(folder) != str(init_from) else init_from
        log(f"model.init_from: {where} ({model.config.arch}, vocabulary {model.config.vocab_size})")
    _check_lora_early(config, model)
    if pipeline is None:
        pipeline = DataPipeline.build(config.data, out, show_progress=show_progress, tokenizer=tokenizer, check=False)
    if model is None:
        model_cfg = config.model_config(**pipeline.model_overrides(config.model.arch))  # validated once
        if pipelined:  # each rank draws its stage's initial weights from this state (attnlab.parallel.materialise)
            rng_state = torch.get_rng_state()
            with torch.device("meta"):
                model = _build(model_cfg)
            model.stage_source = StageSource(rng_state=rng_state)
        else:
            model = _build(model_cfg)
        if config.lora is not None:
            warnings.warn("lora without model.init_from: the adapters train over randomly initialised base "
                          "weights, which stay frozen; set model.init_from to a pretrained model", UserWarning,
                          stacklevel=3)
    elif init_from:
        check_fits(model, pipeline)
    if getattr(model.config, "memory_len", 0):  # Transformer-XL: consecutive segments, the memory carried
        return _recurrence_task(config, pipeline), model
    return PretrainTask(pipeline, eval_batches=config.train.eval_batches, bleu_samples=config.train.bleu_samples), model


@dataclass(frozen=True)
class StageSource:
    """Where the stage of a model built on the meta device (parallel.pp > 1) takes its weights
    from: drawn from `rng_state`, torch's CPU generator state a whole `build_model` would start
    from (the stage's weights then equal the whole model's), or read from `weights`, a
    model.safetensors holding the whole model under its attnlab names."""

    rng_state: torch.Tensor | None = None
    weights: Path | None = None

    def __post_init__(self) -> None:
        if (self.rng_state is None) == (self.weights is None):
            raise ValueError("StageSource needs exactly one of rng_state and weights")


def _build(config: ModelConfig) -> nn.Module:
    from attnlab.models import build_model

    return build_model(config)


def _weights_file(folder: Path) -> Path | None:
    """The model.safetensors that holds a model.init_from folder's weights under attnlab's names:
    an attnlab.save folder's, or the best checkpoint's of an `attnlab train` run without LoRA
    (its files' sha256 checked); None for other folders (Hugging Face names are converted on a
    whole load)."""
    from attnlab.io.checkpoints import read_state, resolve_checkpoint

    data = read_json(folder / "config.json")
    if "arch" in data:
        return folder / "model.safetensors" if (folder / "model.safetensors").is_file() else None
    run = data.get("config") if isinstance(data.get("config"), dict) else {}
    if isinstance(data.get("model"), dict) and (folder / "checkpoints").is_dir() and not run.get("lora"):
        checkpoint = resolve_checkpoint(folder, "best")
        read_state(checkpoint)
        return checkpoint / "model.safetensors"
    return None


def _check_lora_early(config: TrainConfig, model: nn.Module | None) -> None:
    """The `lora` section's target_modules against the model (the given or loaded one, else the
    config's built on the meta device) before the data is prepared: the Trainer wraps it later.

    Raises:
        ConfigError: naming `lora.target_modules` and the pattern that fits nothing.
    """
    if config.lora is None:
        return
    if model is None:
        from attnlab.models import build_model

        with torch.device("meta"):  # names and shapes only: no memory, no initialisation
            model = build_model(config.model_config())
    check_lora_targets(model, config.lora)


def _recurrence_task(config: TrainConfig, pipeline: DataPipeline):
    """The task of a model with a segment memory: data.batch_size streams read in consecutive
    data.seq_len segments (attnlab.training.tasks.recurrence.RecurrenceTask), train.eval_batches
    validation segments per evaluation, read with the memory and without.

    Raises:
        ValueError: an objective other than causal_lm.
    """
    from attnlab.training.tasks.recurrence import RecurrenceTask

    if config.data.objective != "causal_lm":
        raise ValueError(f"model.memory_len={config.model.memory_len} reads a stream in consecutive segments: it "
                         f"trains with data.objective 'causal_lm', got {config.data.objective!r}")
    data = config.data
    return RecurrenceTask(pipeline.train.tokens, pipeline.valid.tokens, batch_size=data.batch_size,
                          seq_len=data.seq_len, eval_segments=config.train.eval_batches, pipeline=pipeline)


def load_init(path: str | os.PathLike, *, folder: Path | None = None) -> tuple[nn.Module, Any]:
    """(model in train mode, float32; its tokenizer) from an attnlab, run or Hugging Face folder,
    or a Hub model `hf:NAME[@REVISION]`; `folder`, when given, is where `path` was found already.

    Raises:
        FileNotFoundError: no such folder, or no tokenizer in it.
        HubError: a Hub model that cannot be had (`attnlab.interop.hub.hub_folder`).
    """
    from attnlab.interop.serialization import load

    folder = folder or _init_folder(path)
    model = load(folder)
    return model.float().train(), load_tokenizer(path, folder)


def load_tokenizer(path: str | os.PathLike, folder: Path) -> Any:
    """The tokenizer of model.init_from `path`, found in `folder`: tokenizer.json, vocab.json +
    merges.txt, or vocab.txt.

    Raises:
        FileNotFoundError: none of them.
    """
    from attnlab.tokenizers import Tokenizer

    for candidate in ("tokenizer.json", "vocab.json", "vocab.txt"):
        if (folder / candidate).is_file():
            return Tokenizer.load(folder if candidate == "vocab.json" else folder / candidate)
    raise FileNotFoundError(f"model.init_from={str(path)!r} has no tokenizer (tokenizer.json, vocab.json + "
                            "merges.txt, or vocab.txt)")


def _init_folder(path: str | os.PathLike, *, config_only: bool = False) -> Path:
    """The folder of model.init_from: itself, or a Hub model's snapshot (only config.json fetched
    with `config_only`)."""
    from attnlab.interop.hub import hub_folder, is_hub_name

    folder = hub_folder(path, config_only=config_only) if is_hub_name(path) else Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model.init_from={str(path)!r}: expected a folder with config.json (an attnlab.save "
                                "folder, an `attnlab train` run folder or a Hugging Face folder)")
    return folder


def read_init_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a model.init_from folder from its config.json alone, without reading
    weights: the folder of `attnlab.save`, an `attnlab train` run (its `model` section) or a
    Hugging Face folder (converted as `attnlab.from_hf` converts it). The three are told apart
    as `attnlab.load` tells them.

    Raises:
        FileNotFoundError: no folder with config.json.
        ValueError: a config that is not a model's, or a Hugging Face architecture attnlab does not convert.
        HubError: a Hub model whose config.json cannot be had (`attnlab.interop.hub.hub_folder`).
    """
    folder = _init_folder(path, config_only=True)  # a Hub model's weights are fetched when the run loads them
    data = read_json(folder / "config.json")
    if "arch" not in data and "model_type" in data:  # a Hugging Face folder
        from attnlab.interop.families import FAMILIES, folder_architecture, supported_architectures

        architecture = folder_architecture(data, str(folder / "config.json"))
        family = next((f for f in FAMILIES if architecture in f.ARCHITECTURES), None)
        if family is None:
            raise ValueError(f"model.init_from={str(path)!r}: unsupported architecture {architecture!r}; attnlab "
                             f"converts {', '.join(supported_architectures())}")
        return family.config_from_hf(data, architecture)
    if "model" in data and (folder / "checkpoints").is_dir():  # an `attnlab train` run
        data = data["model"]
    try:
        return ModelConfig.from_dict(data)
    except ValueError as err:  # a ConfigError (type errors too): name the file it came from
        raise ValueError(f"{folder / 'config.json'}: {err}") from None


def resolve_init_from(config: TrainConfig) -> TrainConfig:
    """`config` with its model section read from model.init_from's folder (`read_init_config`:
    config.json only), keeping init_from and add_special_tokens; `config` itself without init_from.
    Tokens that add_special_tokens adds grow vocab_size when the model is loaded, not here.

    Raises:
        FileNotFoundError, ValueError: init_from is not a model folder (`read_init_config`), or
            holds an architecture that data.objective does not train (`check_objective_fits`).
    """
    return read_init_from(config).config


def read_init_from(config: TrainConfig) -> Resolved:
    """`resolve_init_from`, and the model fields the data section set on the folder's model (a
    BERT folder without its MLM head under masked_lm: `model.head: mlm`), as TrainConfig.resolve
    reports them; the folder's values are not the user's, so they are replaced, not refused.

    Raises:
        FileNotFoundError, ValueError: as `resolve_init_from`.
    """
    if not config.model.init_from:
        return Resolved(config, ())
    found = read_init_config(config.model.init_from)
    data = config.data
    check_objective_fits(data.objective, data.nsp, found.arch)
    model, implied = apply_objective(found.to_dict(), (), data.objective, data.nsp, data.span_boundary)
    model = {**model, "init_from": config.model.init_from, "add_special_tokens": list(config.model.add_special_tokens)}
    return Resolved(TrainConfig.from_dict({**config.to_dict(), "model": model}), tuple(implied))


def check_objective_fits(objective: str, nsp: bool, arch: str) -> None:
    """A pretrained model must be of the architecture the objective trains (a recurrent
    encoder-decoder is one under the encoder-decoder objectives).

    Raises:
        ValueError: naming the objective and the model's architecture.
    """
    wanted = objective_fields(objective, nsp, arch).get("arch", arch)
    if wanted != arch:
        a = lambda word: f"{'an' if word[0] in 'aeiou' else 'a'} {word}"
        raise ValueError(f"data.objective={objective!r} trains {a(wanted)} but model.init_from is {a(arch)}; choose "
                         "an objective that fits it")


def check_fits(model: nn.Module, pipeline: DataPipeline) -> None:
    """`check_objective_fits` for a loaded model and its pipeline.

    Raises:
        ValueError: naming the objective and the model's architecture.
    """
    check_objective_fits(pipeline.cfg.objective, pipeline.cfg.nsp, model.config.arch)


def add_special_tokens(tokenizer: Any, model: nn.Module, tokens: list[str]) -> tuple[Any, nn.Module]:
    """The tokenizer with `tokens` added as special tokens (in place), and the model with as many
    new rows in its token embedding and output head, each the mean of the existing rows (module
    docstring). Tokens the tokenizer already has are left as they are."""
    new = [t for t in tokens if tokenizer.token_to_id(t) is None]
    if not new:
        return tokenizer, model
    tokenizer.add_special_tokens(new)
    if tokenizer.vocab_size <= model.config.vocab_size:  # rows the checkpoint already pads its table with
        return tokenizer, model
    return tokenizer, resize_token_embeddings(model, tokenizer.vocab_size)


@torch.no_grad()
def resize_token_embeddings(model: nn.Module, vocab_size: int) -> nn.Module:
    """A copy of `model` with `vocab_size` token rows (embedding and LM head, tied or not): the
    old rows kept, new rows the mean of the old ones.

    Raises:
        ValueError: vocab_size smaller than the model's.
    """
    from attnlab.models import build_model

    old = model.config.vocab_size
    if vocab_size < old:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the model's {old}; tokens cannot be removed")
    bigger = build_model(model.config.replace(vocab_size=vocab_size)).to(next(model.parameters()).dtype)
    state = model.state_dict()
    target = bigger.state_dict()
    for name, tensor in state.items():
        if target[name].shape == tensor.shape:
            target[name].copy_(tensor)
            continue
        if tensor.shape[0] != old or target[name].shape[1:] != tensor.shape[1:]:
            raise ValueError(f"{name}: cannot grow {tuple(tensor.shape)} to {tuple(target[name].shape)}")
        target[name][:old] = tensor
        target[name][old:] = tensor.float().mean(0).to(tensor.dtype)  # the average token (a bias: its mean)
    return bigger.train(model.training)
