"""nanoGPT's merge without its `.contiguous()`: `y.transpose(1, 2).view(B, T, C)` raises
"view size is not compatible with input tensor's size and stride" on a contiguous y.
"""


def split_heads(x, n_head):
    B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)
    assert C % n_head == 0, f"n_embd {C} is not divisible by n_head {n_head}"
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


def merge_heads(y):
    B, nh, T, hs = y.size()
    return y.transpose(1, 2).view(B, T, nh * hs)  # re-assemble all head outputs side by side
