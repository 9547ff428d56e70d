"""Hugging Face BERT's merge with the permute left out: `context_layer.contiguous().view(B, T, all_head_size)`
reads the (B, H, T, hd) memory as if it were (B, T, C).
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
    context_layer = context_layer.contiguous()
    new_context_layer_shape = (context_layer.size(0), context_layer.size(2), all_head_size)
    return context_layer.view(new_context_layer_shape)
