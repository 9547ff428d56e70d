"""TODO(kata new) the bug, written in an idiom of the zoo: the mistake learners make."""
import torch
import triton
import triton.language as tl


def example(x):
    return x
