"""The data a pretraining run trains on: the objectives' registry (`objectives`) and the pipeline
from a DataConfig to batches (`batches`: tokenizer, cached token files, the objective's batches)."""
