"""Hidden checks of the sliding-window kata: fresh values at each grading, never in a student bundle."""
from graders.sliding_window import (band_case, check_attention, check_decode, check_mask, check_windows,
                                    mask_diagnosis, qkv)


def fresh_chunks(case_rng, window):
    """A stream of 3 windows of tokens or more: chunks of 1 to window tokens, and after the first
    window one chunk longer than the window (a prefill), whose queries see keys in rotated slots:
    it comes where the window - 1 tokens before it wrap around the buffer's end, so that slot order
    is not time order there (which takes a window of 3 or more)."""
    chunks = []
    while sum(chunks) <= window or sum(chunks) % window in (0, window - 1):   # else they lie in order
        chunks.append(int(case_rng.integers(1, window + 1)))
    chunks.append(window + int(case_rng.integers(1, 3)))
    while sum(chunks) < 3 * window:
        chunks.append(int(case_rng.integers(1, window + 1)))
    return chunks


def test_fresh_band_and_attention(learner, bugs, kata, case_rng, rng, device):
    """another (Tq <= Tk, window, B, H, head_dim): the mask is the band and the attention equals the reference"""
    tol = kata.tolerance("float64")
    Tk = int(case_rng.integers(17, 25))   # no public case has 17 to 24 keys
    Tq = int(case_rng.integers(2, Tk))   # Tq < Tk: the alignment shows
    window = int(case_rng.integers(2, Tk))   # inside the keys: the band's far edge shows
    h = int(case_rng.integers(2, 5))
    d = int(case_rng.choice([n for n in range(3, 8) if n != h]))
    wrong = bugs.expected.wrong_masks(Tq, Tk, window)
    got = learner.sliding_window_mask(Tq, Tk, window)
    check_mask(got, bugs.expected.band(Tq, Tk, window), call=f"sliding_window_mask({Tq}, {Tk}, {window})",
               case=band_case(Tq, Tk, window),
               diagnose=lambda: bugs.match(got, lambda impl: impl.sliding_window_mask(Tq, Tk, window), **tol)
               or mask_diagnosis(got, wrong))
    q, k, v = qkv(rng, Tq, Tk, b=int(case_rng.integers(2, 4)), h=h, d=d, dv=d + 2)
    expected = bugs.reference.sliding_window_attention(q, k, v, window)
    check_attention(learner, bugs, kata, device, q, k, v, window, expected, against="the reference, in float64",
                    about=band_case(Tq, Tk, window))


def test_fresh_rolling_decode(learner, bugs, kata, case_rng, rng, device):
    """another window and stream of chunks, one longer than the window: the windows returned and the decoded outputs are right"""
    window = int(case_rng.integers(3, 7))   # with 2, the one token read back has no order to get wrong
    chunks = fresh_chunks(case_rng, window)
    check_windows(learner, bugs, kata, rng, device, window, chunks)
    h = int(case_rng.integers(2, 5))
    d = int(case_rng.choice([n for n in range(3, 8) if n != h]))
    check_decode(learner, bugs, kata, rng, device, window, chunks, sizes=(int(case_rng.integers(2, 4)), h, d, d + 1))
