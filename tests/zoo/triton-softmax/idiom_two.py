"""TODO(kata new) whose idiom this imitates (nanoGPT, Hugging Face, Llama, d2l, einsum, loops), and what
about it a grader could get wrong."""
import torch
import triton
import triton.language as tl


def example(x):
    return x + x
