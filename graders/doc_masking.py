"""Grader of the doc-masking kata (katas/doc-masking/README.md)."""
import contextlib

import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import CheckFailed, LearnerRaised
from graders.engine.learner import describe_value
from graders.engine.recording import NotRecorded
from graders.engine.structure import banned_used, check_untampered

H, D, DV = 3, 4, 10   # H != head_dim, and v's width differs from q/k's and from every T used
EXACT = {"rtol": 0.0, "atol": 0.0}   # ids, positions and masks are integers and bools

ROW = [0, 3, 7, 8]   # the README's row: documents of 3, 4 and 1 tokens
RAGGED = [0, 5, 6, 6, 11, 13]   # a one-token document and an empty one
PREFIX_ROW = [0, 4, 9, 12]   # prefixes of 2, 3 and 1 inside the documents


def cu(values, dtype=torch.int32, device=None):
    return torch.tensor(values, dtype=dtype, device=device)


def random_cu(case_rng, n_docs, dtype=torch.int32):
    """A random packing of n_docs documents of 0..6 tokens, at least one non-empty."""
    lengths = case_rng.integers(0, 7, size=n_docs)
    lengths[case_rng.integers(n_docs)] = max(int(lengths.max()), 1)
    return torch.tensor([0] + list(map(int, lengths.cumsum())), dtype=dtype)


def randn(rng, *shape, dtype=torch.float64):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def qkv(rng, batch, t, dtype=torch.float64):
    return randn(rng, *batch, t, D, dtype=dtype), randn(rng, *batch, t, D, dtype=dtype), \
        randn(rng, *batch, t, DV, dtype=dtype)


def show(cu_seqlens) -> str:
    return f"cu_seqlens = tensor({cu_seqlens.tolist()}, dtype={str(cu_seqlens.dtype)[6:]})"


def grid(mask) -> str:
    lines = mask.to("cpu").int().tolist()
    return f"bool{list(mask.shape)}, one row per query, 1 = may attend:" + "".join(
        "\n    " + " ".join(map(str, line)) for line in lines)


def check_mask(got, expected, *, call, case, diagnose, device=None):
    expect.bool_mask(got, tuple(expected.shape), call=call, case=case, device=device)
    wrong = got.to("cpu") != expected
    first = ", ".join(str(int(i)) for i in torch.nonzero(wrong)[0]) if wrong.any() else ""
    expect.that(not wrong.any(), f"The mask is wrong at {int(wrong.sum())} of {wrong.numel()} positions "
                f"(first at [{first}]).", call=call, case=case,
                got=grid(got), expected=grid(expected), diagnose=diagnose)


def wrong_upstream(learner, bugs, cu_seqlens, tol):
    """(sentence, diagnosis) when your document_ids or position_ids differ from the expected ones on
    ``cu_seqlens``, else None: masks built on them (as the hints suggest) inherit their mistake, and
    it is theirs that needs fixing. The diagnosis is their known bug's, or None: never a mask's."""
    for name, make, expected, compute in (
            ("document_ids", lambda: learner.document_ids(cu_seqlens), bugs.expected.ids(cu_seqlens),
             lambda impl: impl.document_ids(cu_seqlens)),
            ("position_ids", lambda: learner.position_ids(cu_seqlens), bugs.expected.positions(cu_seqlens),
             lambda impl: impl.position_ids(cu_seqlens))):
        try:
            got = make()
        except LearnerRaised:
            continue   # its own check says so; whether the mask used it is not known here
        if type(got) is torch.Tensor and tuple(got.shape) == tuple(expected.shape) \
                and torch.equal(got.cpu().long(), expected):
            continue
        shown = got.cpu().long().tolist() if type(got) is torch.Tensor else describe_value(got)
        return (f"Your {name}(cu_seqlens) is wrong on this row: it gives {shown}, not {expected.tolist()}. "
                f"A mask built on it inherits its mistake: fix {name} first."), bugs.match(got, compute, **tol)
    return None


@contextlib.contextmanager
def blame_upstream(learner, bugs, cu_seqlens, tol):
    """A mask or output judged wrong inside is charged to your document_ids or position_ids
    whenever either is wrong on ``cu_seqlens``, known bug or not: its sentence added, its diagnosis
    (or none) given instead of a mask bug whose mask happens to be the same."""
    try:
        yield
    except CheckFailed as exc:
        if type(exc) is not CheckFailed:   # the learner's code raised, or is not started: that stands
            raise
        try:
            wrong = wrong_upstream(learner, bugs, cu_seqlens, tol)
        except NotRecorded:   # a student bundle without the expected ids: the failure stands as it is
            wrong = None
        if wrong is None:
            raise
        exc.message = f"{exc.message} {wrong[0]}"
        exc.args = (exc.message,)
        exc.diagnosis = wrong[1]
        raise


def tolerances(kata, dtype):
    """(tol, loose): the inputs' dtype's tolerance, and float32's (a float32 softmax inside passes)."""
    return kata.tolerance(dtype), kata.tolerance("float32")


def per_document(q, k, v, cu_seqlens, prefix_lens=None):
    """SDPA on each document's slice alone, in float64, concatenated: (..., T, dv)."""
    outs = []
    bounds = cu_seqlens.tolist()
    for d, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end == start:
            continue
        t = torch.arange(end - start)
        allowed = t[None, :] <= t[:, None]
        if prefix_lens is not None:
            allowed = allowed | (t < int(prefix_lens[d]))[None, :]
        outs.append(F.scaled_dot_product_attention(q[..., start:end, :].double(), k[..., start:end, :].double(),
                                                   v[..., start:end, :].double(), attn_mask=allowed))
    return torch.cat(outs, dim=-2).to(q.dtype)


def test_document_ids_values(learner, bugs, kata, case_rng):
    """document_ids values, int64, any cu_seqlens"""
    tol = kata.tolerance("float64")
    for cu_seqlens in (cu(ROW), cu(RAGGED, torch.int64), random_cu(case_rng, 5)):
        got = learner.document_ids(cu_seqlens)
        expect.array(got, bugs.expected.ids(cu_seqlens), call="document_ids(cu_seqlens)", case=show(cu_seqlens),
                     **EXACT, diagnose=lambda: bugs.match(got, lambda impl: impl.document_ids(cu_seqlens), **tol))


def test_position_ids_restart(learner, bugs, kata, case_rng):
    """position_ids restart at 0 at each document, int64"""
    tol = kata.tolerance("float64")
    for cu_seqlens in (cu(ROW), cu(RAGGED, torch.int64), random_cu(case_rng, 5)):
        got = learner.position_ids(cu_seqlens)
        expect.array(got, bugs.expected.positions(cu_seqlens), call="position_ids(cu_seqlens)",
                     case=show(cu_seqlens), **EXACT,
                     diagnose=lambda: bugs.match(got, lambda impl: impl.position_ids(cu_seqlens), **tol))


def test_document_mask_block_diagonal_causal(learner, bugs, kata, case_rng):
    """document_mask is block-diagonal causal, diagonal included"""
    tol = kata.tolerance("float64")
    for cu_seqlens in (cu(ROW), cu(RAGGED), random_cu(case_rng, 4, torch.int64)):
        got = learner.document_mask(cu_seqlens)
        with blame_upstream(learner, bugs, cu_seqlens, tol):
            check_mask(got, bugs.expected.mask(cu_seqlens), call="document_mask(cu_seqlens)",
                       case=show(cu_seqlens) + ": each document its own causal triangle",
                       diagnose=lambda: bugs.match(got, lambda impl: impl.document_mask(cu_seqlens), **tol))


def test_masks_are_bool_on_device(learner, bugs, kata, rng, device):
    """masks are bool, and every result is on cu_seqlens.device (CUDA too when present)"""
    cu_seqlens = cu(ROW, device=device)
    prefix_lens = torch.tensor([2, 3, 1], device=device)
    for call, make, dtype in (("document_ids(cu_seqlens)", lambda: learner.document_ids(cu_seqlens), torch.int64),
                              ("position_ids(cu_seqlens)", lambda: learner.position_ids(cu_seqlens), torch.int64),
                              ("document_mask(cu_seqlens)", lambda: learner.document_mask(cu_seqlens), torch.bool),
                              ("prefix_lm_mask(cu_seqlens, prefix_lens)",
                               lambda: learner.prefix_lm_mask(cu_seqlens, prefix_lens), torch.bool)):
        got = make()
        case = f"{show(cu_seqlens)} on {device}"
        expect.type_of(got, torch.Tensor, call=call, case=case)
        message = expect.FLOAT_MASK if dtype == torch.bool else "ids and positions are int64 (torch.long)."
        expect.that(got.dtype == dtype, message, call=call, case=case, got=str(got.dtype), expected=str(dtype))
        expect.that(got.device.type == device, "The result is on another device than cu_seqlens.", call=call,
                    case=case, got=str(got.device), expected=device)
    q, k, v = qkv(rng, (H,), ROW[-1])
    out = learner.packed_attention(q.to(device), k.to(device), v.to(device), cu_seqlens)
    expect.type_of(out, torch.Tensor, call="packed_attention(q, k, v, cu_seqlens)")
    expect.that(out.device.type == device, "The output is on another device than q.",
                call="packed_attention(q, k, v, cu_seqlens)", got=str(out.device), expected=device)


def test_prefix_lm_mask_values(learner, bugs, kata, case_rng):
    """prefix_lm_mask values: bidirectional over each prefix, causal after, never across documents"""
    tol = kata.tolerance("float64")
    cases = [(cu(ROW), torch.tensor([2, 3, 1])), (cu(PREFIX_ROW), torch.tensor([2, 3, 1])),
             (cu(RAGGED), torch.tensor([3, 1, 0, 4, 2]))]
    rows = random_cu(case_rng, 4)
    cases.append((rows, torch.from_numpy(case_rng.integers(0, 5, size=4))))
    for cu_seqlens, prefix_lens in cases:
        got = learner.prefix_lm_mask(cu_seqlens, prefix_lens)
        with blame_upstream(learner, bugs, cu_seqlens, tol):
            check_mask(got, bugs.expected.mask(cu_seqlens, prefix_lens),
                       call="prefix_lm_mask(cu_seqlens, prefix_lens)",
                       case=f"{show(cu_seqlens)}, prefix_lens = tensor({prefix_lens.tolist()})",
                       diagnose=lambda: bugs.match(got, lambda impl: impl.prefix_lm_mask(cu_seqlens, prefix_lens),
                                                   **tol))


def test_packed_equals_per_document(learner, bugs, kata, case_rng, rng, device):
    """packed_attention equals SDPA on each document alone, float32 and float64, with heads"""
    cases = [((H,), cu(ROW), torch.float64), ((1, H), cu(RAGGED), torch.float64),
             ((), random_cu(case_rng, 4), torch.float64), ((H,), cu(PREFIX_ROW), torch.float32)]
    for batch, cu_seqlens, dtype in cases:
        q, k, v = qkv(rng, batch, int(cu_seqlens[-1]), dtype)
        tol, loose = tolerances(kata, dtype)
        result = learner.packed_attention(q, k, v, cu_seqlens)
        with blame_upstream(learner, bugs, cu_seqlens, kata.tolerance("float64")):
            expect.array(result, per_document(q, k, v, cu_seqlens), call="packed_attention(q, k, v, cu_seqlens)",
                         case=f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} {str(dtype)[6:]}; "
                              f"{show(cu_seqlens)}", device=device, **tol, float32_inside=loose,
                         against="SDPA on each document alone",
                         diagnose=lambda: bugs.match(result, lambda impl: impl.packed_attention(q, k, v, cu_seqlens),
                                                     **loose))


def test_edge_documents(learner, bugs, kata, rng):
    """empty and one-token documents, a single document, prefixes of 0 and longer than the document"""
    tol = kata.tolerance("float64")
    for cu_seqlens in (cu([0, 0, 1, 1, 3, 3]), cu([0, 6]), cu([0, 1])):
        got = learner.document_mask(cu_seqlens)
        with blame_upstream(learner, bugs, cu_seqlens, tol):
            check_mask(got, bugs.expected.mask(cu_seqlens), call="document_mask(cu_seqlens)", case=show(cu_seqlens),
                       diagnose=lambda: bugs.match(got, lambda impl: impl.document_mask(cu_seqlens), **tol))
        got = learner.position_ids(cu_seqlens)
        expect.array(got, bugs.expected.positions(cu_seqlens), call="position_ids(cu_seqlens)",
                     case=show(cu_seqlens), **EXACT,
                     diagnose=lambda: bugs.match(got, lambda impl: impl.position_ids(cu_seqlens), **tol))
    cu_seqlens, prefix_lens = cu([0, 4, 7]), torch.tensor([0, 9])   # none, and longer than its document
    got = learner.prefix_lm_mask(cu_seqlens, prefix_lens)
    with blame_upstream(learner, bugs, cu_seqlens, tol):
        check_mask(got, bugs.expected.mask(cu_seqlens, prefix_lens), call="prefix_lm_mask(cu_seqlens, prefix_lens)",
                   case=f"{show(cu_seqlens)}, prefix_lens = tensor([0, 9]): document 1 is all prefix",
                   diagnose=lambda: bugs.match(got, lambda impl: impl.prefix_lm_mask(cu_seqlens, prefix_lens),
                                               **tol))
    cu_seqlens = cu([0, 6])
    q, k, v = qkv(rng, (H,), 6)
    tol, loose = tolerances(kata, q.dtype)
    result = learner.packed_attention(q, k, v, cu_seqlens)
    with blame_upstream(learner, bugs, cu_seqlens, kata.tolerance("float64")):
        expect.array(result, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                     call="packed_attention(q, k, v, cu_seqlens)", case=f"one document: {show(cu_seqlens)}",
                     **tol, float32_inside=loose, against="causal SDPA",
                     diagnose=lambda: bugs.match(result, lambda impl: impl.packed_attention(q, k, v, cu_seqlens),
                                                 **loose))


def test_banned_api(learner, bugs, kata, rng):
    """no library attention: masks and attention written with tensor operations"""
    cu_seqlens = cu(ROW)
    learner.packed_attention(*qkv(rng, (H,), ROW[-1]), cu_seqlens)   # first call: lazy imports before recording
    q, k, v = qkv(rng, (H,), ROW[-1])
    with learner.recording() as ops:
        learner.document_mask(cu_seqlens)
        learner.prefix_lm_mask(cu_seqlens, torch.tensor([2, 3, 1]))
        learner.packed_attention(q, k, v, cu_seqlens)
        learner.packed_attention(q, k, v, cu_seqlens, torch.tensor([2, 3, 1]))
    used = banned_used(learner.source, ops, kata.banned)
    call = "packed_attention(q, k, v, cu_seqlens)"
    expect.that(not used, "Your code uses a library attention this kata forbids.", call=call,
                got=", ".join(used), expected="only tensor operations (matmul, masked_fill, softmax)",
                diagnose=lambda: "banned-api")
    check_untampered(learner, call=call)
