"""Instruments to look inside models: any activation by name (hooks, run_with_cache), attention maps,
head importance and pruning, gradient flow through time, rank collapse, cost counters, attention as
kernel regression. Patching and ablation (patching, path_patching, ablation) say which activations
carry the difference between a clean and a corrupted input; attribution (integrated gradients,
gradient x input, attention rollout and flow, the logit lens) which inputs and layers an output
comes from. Plots (PNG) need matplotlib, imported only when a plot is drawn."""

from attnlab.inspect.ablation import AblationResult, ablate
from attnlab.inspect.attention_flow import attention_flow, attention_rollout, self_attention_maps
from attnlab.inspect.attention_maps import AttentionRecord, attention_maps, attention_modules, capture_attention
from attnlab.inspect.attribution import Attribution, gradient_x_input, integrated_gradients
from attnlab.inspect.cost import CostRow, cost_table, crossover_seq_len
from attnlab.inspect.gradient_flow import gradient_flow, source_gradient_norms, state_gradient_norms
from attnlab.inspect.heads import (attention_entropy, head_importance, head_mask, mask_from_heads, prune_heads,
                                   pruning_curve)
from attnlab.inspect.hooks import ActivationCache, hooks, run_with_cache
from attnlab.inspect.kernel_regression import nadaraya_watson
from attnlab.inspect.logit_lens import lens_top_tokens, logit_lens
from attnlab.inspect.path_patching import path_patching
from attnlab.inspect.patching import (PatchResult, activation_patching, logit_diff, normalised_score, target_logprob,
                                      target_prob)
from attnlab.inspect.rank_collapse import rank_collapse, relative_residual

__all__ = [
    "ActivationCache", "AttentionRecord", "Attribution", "CostRow", "attention_entropy", "attention_flow",
    "attention_maps", "attention_modules", "attention_rollout", "capture_attention", "cost_table", "crossover_seq_len",
    "gradient_flow", "gradient_x_input", "head_importance", "head_mask", "hooks", "integrated_gradients",
    "lens_top_tokens", "logit_lens", "mask_from_heads", "nadaraya_watson", "prune_heads", "pruning_curve",
    "rank_collapse", "relative_residual", "run_with_cache", "self_attention_maps", "source_gradient_norms",
    "state_gradient_norms",
    # patching and ablation
    "AblationResult", "PatchResult", "ablate", "activation_patching", "logit_diff", "normalised_score", "path_patching",
    "target_logprob", "target_prob",
]
