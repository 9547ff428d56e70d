"""Known split-heads bugs, each the reference function with exactly that mistake."""


def split_heads_view_only(x, n_heads):
    B, T, C = x.shape
    if C % n_heads:
        raise ValueError(f"C = {C} channels cannot be split into n_heads = {n_heads} equal heads")
    return x.view(B, n_heads, T, C // n_heads)   # the right shape, but (B, T, C) memory read as (B, H, T, hd)


def split_heads_unchecked(x, n_heads):
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)   # an indivisible C fails inside view


def merge_heads_reshape_only(x):
    B, H, T, hd = x.shape
    return x.reshape(B, T, H * hd)   # (B, H, T, hd) memory read as (B, T, C)


def merge_heads_view_after_transpose(x):
    B, H, T, hd = x.shape
    return x.transpose(1, 2).view(B, T, H * hd)   # view after a transpose: fails on a contiguous x


BUGS = {
    "view-without-transpose": {"split_heads": split_heads_view_only},
    "merge-without-transpose": {"merge_heads": merge_heads_reshape_only},
    "merge-needs-contiguous": {"merge_heads": merge_heads_view_after_transpose},
    "missing-divisibility-check": {"split_heads": split_heads_unchecked},
}
