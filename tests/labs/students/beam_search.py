"""A student's beam search, written from the stub's docstring alone (not from attnlab's code)."""

import torch


def beam_search(next_logprobs, prompt, *, num_beams, max_new_tokens, eos_token_id=None, length_penalty=1.0):
    beams = [(0.0, [])]  # (sum of log-probs, new tokens)
    finished = []  # (score, new tokens)
    for step in range(max_new_tokens):
        last = step == max_new_tokens - 1
        scores, choices = [], []
        for total, tokens in beams:
            logp = next_logprobs(prompt + tokens)
            scores.append(total + logp)
        flat = torch.cat(scores)
        V = flat.numel() // len(beams)
        ranked = flat.argsort(descending=True, stable=True).tolist()
        next_beams = []
        for rank, index in enumerate(ranked):
            beam, token = divmod(index, V)
            total, tokens = flat[index].item(), beams[beam][1] + [token]
            if token == eos_token_id or last:
                if rank < num_beams:
                    finished.append((total / len(tokens) ** length_penalty, tokens))
            elif len(next_beams) < num_beams:
                next_beams.append((total, tokens))
            if len(next_beams) == num_beams and rank >= num_beams:
                break
        beams = next_beams
        if len(finished) >= num_beams:
            break
    return max(finished, key=lambda f: f[0])[1]
