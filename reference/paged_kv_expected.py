"""The paged-KV grader's expected values, computed apart from the reference: no blocks at all.

Each sequence is kept contiguous, as the tokens it was given, and attention is written out per
sequence and per head. They are answers as much as the reference is, so they stay out of student
bundles with it: the grader asks for them as ``bugs.expected``.
"""
import math

import torch


def blocks_held(length: int, block_size: int) -> int:
    """Blocks a sequence of ``length`` tokens holds: the last one holds 1 to block_size tokens."""
    blocks = 0
    while blocks * block_size < length:
        blocks += 1
    return blocks


def forked_blocks(prompt: int, block_size: int, n: int) -> int:
    """Blocks held after a prompt of ``prompt`` tokens is shared by ``n`` sequences (the original
    included) and each appends one token, with copy on write: the prompt's blocks, plus one block
    per sequence, less one when the prompt's last block is partial (its last holder writes it in place)."""
    partial = prompt % block_size != 0
    return blocks_held(prompt, block_size) + n - (1 if partial else 0)


class ContiguousSequences:
    """What each sequence holds, kept as the tokens it was given: seq_id -> (k, v), (L, n_kv_heads, head_dim)."""

    def __init__(self):
        self.tokens = {}

    def append(self, seq_id, k, v):
        old_k, old_v = self.tokens.get(seq_id, (k[:0], v[:0]))
        self.tokens[seq_id] = (torch.cat([old_k, k]), torch.cat([old_v, v]))

    def fork(self, src, dst):
        self.tokens[dst] = self.tokens[src]

    def free(self, seq_id):
        del self.tokens[seq_id]


def decode_attention(q, sequences: ContiguousSequences, seq_ids):
    """q (B, n_heads, head_dim) against each sequence's tokens, head by head, in float64:
    (B, n_heads, head_dim). Query head j reads KV head j // (n_heads // n_kv_heads)."""
    B, H, hd = q.shape
    out = torch.empty(B, H, hd, dtype=torch.float64)
    for b, seq_id in enumerate(seq_ids):
        k, v = (t.to(torch.float64) for t in sequences.tokens[seq_id])   # (L, Hkv, hd)
        n_rep = H // k.shape[1]
        for h in range(H):
            scores = k[:, h // n_rep] @ q[b, h].to(torch.float64) / math.sqrt(hd)   # (L,)
            weights = torch.exp(scores - scores.max())
            out[b, h] = (weights / weights.sum()) @ v[:, h // n_rep]
    return out
