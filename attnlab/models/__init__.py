"""Models composed from `attnlab.nn`: Encoder, Decoder, EncoderDecoder, heads, the builder, and
the image encoder over patches (VisionEncoder)."""

from attnlab.models.build import build_model
from attnlab.models.embeddings import Embeddings
from attnlab.models.heads import ClassificationHead, LMHead, MLMHead, Pooler
from attnlab.models.rnn import RNNDecoderState, RNNEncoderDecoder
from attnlab.models.transformer import Decoder, Encoder, EncoderDecoder, TransformerStack
from attnlab.models.vision import VisionConfig, VisionEncoder

__all__ = [
    "ClassificationHead", "Decoder", "Embeddings", "Encoder", "EncoderDecoder", "LMHead", "MLMHead", "Pooler",
    "RNNDecoderState", "RNNEncoderDecoder", "TransformerStack", "VisionConfig", "VisionEncoder", "build_model",
]
