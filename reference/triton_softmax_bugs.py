"""Known triton-softmax bugs, each a complete reference with exactly that mistake."""


def example_not_doubled(x):
    return x   # TODO(kata new) a mistake learners make, with a comment that says what goes wrong


BUGS = {"example-bug": {"example": example_not_doubled}}
