"""What is specific to the triton-softmax kata: the facts its README teaches. TODO(kata new) test each claim of the README
that code can check, with the installed libraries."""
from reference.triton_softmax import example


def test_example_doubles():
    assert example(1.5) == 3.0
