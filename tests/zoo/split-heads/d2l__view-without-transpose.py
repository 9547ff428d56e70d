"""d2l's transpose_qkv with the heads reshaped straight into place, `X.reshape(B, num_heads, T, -1)`:
the right shape, but the (B, T, C) memory read as (B, H, T, hd).
"""


def split_heads(X, num_heads):
    if X.shape[2] % num_heads:
        raise ValueError(f"num_hiddens = {X.shape[2]} must be divisible by num_heads = {num_heads}")
    return X.reshape(X.shape[0], num_heads, X.shape[1], -1)


def merge_heads(X):
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)
