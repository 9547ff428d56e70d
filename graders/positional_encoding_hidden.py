"""Hidden checks of the positional-encoding kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.engine import expect
from graders.positional_encoding import pe_tolerance, shift_tolerance, table_form


def fresh_table(case_rng):
    """(T, d) drawn from case_rng: 2 to 16 (sin, cos) pairs, and T > d so a transposed table shows."""
    d = 2 * int(case_rng.integers(2, 17))
    return int(case_rng.integers(d + 8, 97)), d


def test_shift_identity(learner, bugs, kata, case_rng):
    """PE[p + k] == PE[p] @ M_k.T with your sinusoidal and your shift_matrix, at other T, d and k, for every p"""
    # Only this property, judged on what your code answers: whether the table and M_k hold the right
    # values is the value checks' business (a shift that matches its own table is still a shift).
    T, d = fresh_table(case_rng)
    table_call = f"sinusoidal({T}, {d})"
    pe = learner.sinusoidal(T, d)
    table_form(pe, (T, d), call=table_call)
    table = pe.detach().cpu().double()   # (T, d)
    offsets = int(case_rng.integers(1, T // 2)), -int(case_rng.integers(1, T // 2)), int(case_rng.integers(T // 2, T - 1))
    for k in offsets:
        call = f"shift_matrix({k}, {d})"
        m = learner.shift_matrix(k, d)
        table_form(m, (d, d), call=call, what="M_k")
        p = torch.arange(max(0, -k), min(T, T - k))   # every p with p and p + k in 0..T-1
        shifted, rotated = table[p + k], table[p] @ m.detach().cpu().double().T   # (n, d) each
        case = f"PE = {table_call}, k = {k}, every p with p and p + k in 0..{T - 1}"
        expect.that(expect.mismatch(shifted, table[p], **pe_tolerance(kata, T)) is not None,
                    "Your table gives positions p and p + k the same vectors: an encoding that does not change "
                    "with the position shows nothing about a shift.", call=table_call, case=case,
                    got="PE[p + k] == PE[p] for every p", expected="vectors that differ from one position to another")
        # PE[p + k] is off by up to a few ulps of T - 1; each entry of PE[p] @ M_k.T sums two products
        # of entries off by that much and by a few ulps of |k|.
        tol = kata.tolerance("float32", magnitude=3 * (T - 1) + 2 * abs(k))
        problem = expect.mismatch(rotated, shifted, **tol)
        expect.that(problem is None, f"Your M_k does not shift your table by k = {k}.",
                    call=f"{table_call}[p] @ {call}.T", case=case,
                    got=f"PE[p] @ M_k.T against PE[p + k] (row r is p = {int(p[0])} + r): {problem}",
                    expected="PE[p + k] for every p",
                    diagnose=lambda: bugs.match(pe, lambda impl: impl.sinusoidal(T, d), **pe_tolerance(kata, T))
                    or bugs.match(m, lambda impl: impl.shift_matrix(k, d), **shift_tolerance(kata, k)))


def test_dot_product_depends_on_offset(learner, bugs, kata, case_rng):
    """PE[p] · PE[p + k] depends on the offset k only, not on p (your sinusoidal, other T and d)"""
    T, d = fresh_table(case_rng)
    call = f"sinusoidal({T}, {d})"
    pe = learner.sinusoidal(T, d)
    table_form(pe, (T, d), call=call)
    table = pe.detach().cpu().double()   # (T, d)
    K = T // 2   # offsets 0..K-1, each at positions 0..T-K
    dots = torch.stack([(table[: T - K + 1] * table[k: T - K + 1 + k]).sum(-1) for k in range(K)], dim=-1)   # (P, K)
    case = f"PE = {call}; offsets k = 0..{K - 1}, positions p = 0..{T - K}"
    curve = dots[0].expand_as(dots)   # PE[0] · PE[k] for every p
    expect.that(expect.mismatch(dots[0], dots[0, :1].expand(K), **pe_tolerance(kata, T)) is not None,
                "PE[0] · PE[k] is the same for every offset: an encoding that gives every position the same "
                "vector says nothing about position.", call=call, case=case,
                got=f"PE[0] · PE[k] = {dots[0, 0].item():.4g} for every k", expected="dot products that change with k")
    # A dot product sums d products of entries each off by a few ulps of T - 1; two of them are compared.
    problem = expect.mismatch(dots, curve, **kata.tolerance("float32", magnitude=4 * d * (T - 1)))
    if problem is not None:
        spread = (dots - curve).abs().max(0).values   # (K,)
        k = int(spread.argmax())
        p = int((dots[:, k] - curve[:, k]).abs().argmax())
        expect.fail("PE[p] · PE[p + k] changes with p: the dot product of two of your encodings depends on where "
                    "they are, not only on how far apart.", call=call, case=case,
                    got=f"at k = {k}: PE[0] · PE[{k}] = {dots[0, k].item():.6g}, PE[{p}] · PE[{p + k}] = "
                        f"{dots[p, k].item():.6g} ({problem})",
                    expected="the same value for every p (each (sin, cos) pair contributes cos(k·ω_i))",
                    diagnose=lambda: bugs.match(pe, lambda impl: impl.sinusoidal(T, d), **pe_tolerance(kata, T)))
