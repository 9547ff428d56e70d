"""Hidden checks of the flops-memory kata: fresh values at each grading, never in a student bundle."""
from graders.engine import expect
from graders.flops_memory import DTYPES, as_count, call_text, diagnosis


def test_max_seq_len_fits(learner, bugs, case_rng):
    """max_seq_len returns a T whose scores fit, while T + 1 does not, boundaries included"""
    fixed = 2 * 4 * 2   # B * H * bytes_per_element of the T = 777 cases
    drawn_B, drawn_H, drawn_size = int(case_rng.integers(2, 9)), int(case_rng.integers(2, 33)), int(case_rng.choice([1, 2, 4]))
    drawn_pair = drawn_B * drawn_H * drawn_size   # bytes of one (query, key) pair over the batch and heads
    T0 = int(case_rng.integers(100, 5001))
    cases = [  # (memory_bytes, B, H, bytes_per_element or None for the default, what it is)
        (2**30, 1, 32, None, "1 GiB, fp16 (the default): exactly full at T = 4096"),
        (fixed * 777**2, 2, 4, 2, "exactly full at T = 777"),
        (fixed * 777**2 - 1, 2, 4, 2, "one byte short of T = 777"),
        (fixed * 778**2 - 1, 2, 4, 2, "one byte short of T = 778"),
        (24 * 2**30, 1, 16, 4, "24 GiB, fp32"),
        (drawn_pair * T0**2 + int(case_rng.integers(0, drawn_pair * (2 * T0 + 1))), drawn_B, drawn_H, drawn_size,
         f"between the sizes of T = {T0} and T = {T0 + 1}"),
    ]
    for memory, B, H, size, what in cases:
        args, kwargs = (memory, B, H), {} if size is None else {"bytes_per_element": size}
        call = call_text("max_seq_len", args, kwargs)
        dtype = str(DTYPES[size or 2]).removeprefix("torch.")
        case = f"memory_bytes = {memory:,}, ({B}, {H}, T, T) {dtype} scores; {what}"
        right = bugs.reference.max_seq_len(memory, B, H, size or 2)

        def scores(T):   # Python ints: an absurd T cannot overflow
            return B * H * T * T * (size or 2)

        got = as_count(learner.max_seq_len(*args, **kwargs), call=call, case=case, expected=right)
        diagnose = lambda: diagnosis(bugs, got, "max_seq_len", args, kwargs) or (
            "max-seq-len-off-by-one" if got == right - 1 else None)
        expect.that(got >= 0, "A sequence length cannot be negative.", call=call, case=case, got=f"{got:,}",
                    expected=f"T = {right:,}", diagnose=diagnose)
        expect.that(scores(got) <= memory, "The scores of the T you returned do not fit in memory_bytes.",
                    call=call, case=case, got=f"T = {got:,}, whose scores take {scores(got):,} bytes",
                    expected=f"T = {right:,}, whose scores take {scores(right):,} bytes", diagnose=diagnose)
        expect.that(scores(got + 1) > memory, "T + 1 fits too: return the LARGEST T whose scores fit.",
                    call=call, case=case, got=f"T = {got:,}, yet T = {got + 1:,} takes only {scores(got + 1):,} bytes",
                    expected=f"T = {right:,}", diagnose=diagnose)
