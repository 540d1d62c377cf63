"""Synthetic training data that a model can learn, so a falling loss proves the slice computes.

Random tokens (the seed's data) cannot be learned: their loss stays at ln(vocab). Here every
sequence is a *successor chain*: a fixed random permutation ``succ`` of a small alphabet of
token ids, and each sequence follows ``t[i+1] = succ[t[i]]`` from a random start. The next
token is a function of the current one, so the loss can fall far below the unigram entropy
ln(alphabet) — a model that only learned token frequencies would stop there.
"""

from __future__ import annotations

import torch

from draslice.errors import InvalidParameter


def successor_chains(
    n_sequences: int, seq_len: int, alphabet: int, vocab_size: int, seed: int
) -> torch.Tensor:
    """``n_sequences`` x ``seq_len`` token ids drawn from ``alphabet`` ids of the vocabulary."""
    if n_sequences <= 0:
        raise InvalidParameter("dataset_size", n_sequences, "must be >= 1")
    if seq_len < 2:
        raise InvalidParameter("seq_len", seq_len, "must be >= 2 (a next token to predict)")
    if not 2 <= alphabet <= vocab_size:
        raise InvalidParameter("alphabet", alphabet, f"must be in [2, vocab_size={vocab_size}]")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(vocab_size, generator=gen)[:alphabet]  # which vocabulary ids are used
    succ = torch.randperm(alphabet, generator=gen)  # the rule the model has to learn
    cur = torch.randint(0, alphabet, (n_sequences,), generator=gen)
    seqs = torch.empty(n_sequences, seq_len, dtype=torch.long)
    for i in range(seq_len):
        seqs[:, i] = ids[cur]
        cur = succ[cur]
    return seqs

