"""A student's BPE merge step, written from the stub's docstring alone."""

from collections import Counter


def best_pair(words, counts):
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    if not pairs:
        return None
    return min(pairs.items(), key=lambda item: (-item[1], item[0]))


def merge_pair(word, pair, new_id):
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
