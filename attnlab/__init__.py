"""attnlab: the Transformer family and its recurrent ancestors, to build, train, decode and inspect.

    import attnlab
    cfg = attnlab.presets.get("tiny-decoder")
    model = attnlab.build_model(cfg)
    logits = model(input_ids)            # (B, T, V)
"""

from attnlab import data, finetune, inspect, parallel, presets, training
from attnlab.config import AttentionConfig, ModelConfig, PositionConfig, RNNConfig
from attnlab.decoding import GenerateOutput, generate
from attnlab.interop import from_hf, to_hf
from attnlab.models import Decoder, Encoder, EncoderDecoder, RNNEncoderDecoder, build_model
from attnlab.prompts import FewShotPrompt
from attnlab.sentence import embed
from attnlab.serialization import load, save
from attnlab.tokenizers import Tokenizer
from attnlab.training import TrainConfig, Trainer

__version__ = "0.1.0"

__all__ = [
    "AttentionConfig", "Decoder", "Encoder", "EncoderDecoder", "FewShotPrompt", "GenerateOutput", "ModelConfig",
    "PositionConfig", "RNNConfig", "RNNEncoderDecoder", "Tokenizer", "TrainConfig", "Trainer", "build_model", "data",
    "embed", "finetune", "from_hf", "generate", "inspect", "load", "parallel", "presets", "save", "to_hf", "training",
]
