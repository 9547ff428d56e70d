"""Grader of the triton-flash kata (katas/triton-flash/README.md)."""
import torch
import triton
import triton.language as tl

from graders.engine import expect

SHAPES = [(2, 5), (3, 4, 6)]   # TODO(kata new) the public cases: every listed bug must show on them


def judge(learner, bugs, kata, x, case):
    """example(x) equals the reference's, to the tolerance of float64."""
    got = learner.example(x)
    tol = kata.tolerance("float64")
    expect.array(got, bugs.reference.example(x), call="example(x)", case=case, **tol,
                 diagnose=lambda: bugs.match(got, lambda impl: impl.example(x), **tol))


def test_matches_reference(learner, bugs, kata, rng):
    """matches the reference on every case"""
    for shape in SHAPES:   # the structure is the grader's; rng draws the values, fresh at each seed
        judge(learner, bugs, kata, torch.from_numpy(rng.standard_normal(shape)), f"x: float64 {shape}, standard normal")
