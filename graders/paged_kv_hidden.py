"""Hidden checks of the paged-kv kata: fresh values at each grading, never in a student bundle."""
import torch

from graders.paged_kv import attention_judge, ceil_div, config_text, drive, normal, tokens


def fresh_dims(case_rng):
    """(n_heads, n_kv_heads, head_dim, block_size) drawn from case_rng: 2 or 3 KV heads, groups of 2 or
    3 query heads. With one KV head or groups of one, KV heads tiled ([kv0, kv1, kv0, kv1]) and
    interleaved ([kv0, kv0, kv1, kv1]) are the same; the public check has groups of one."""
    Hkv = int(case_rng.integers(2, 4))
    return Hkv * int(case_rng.integers(2, 4)), Hkv, int(case_rng.integers(3, 7)), int(case_rng.integers(2, 6))


def attend(case_rng, rng, live, H, hd, dtype):
    """An "attend" op: one query for each live sequence, in a random order."""
    ids = tuple(int(s) for s in case_rng.permutation(sorted(live)))
    return ("attend", normal(rng, len(ids), H, hd).to(dtype), ids)


def test_fresh_random_schedule(learner, bugs, kata, case_rng, rng, device):
    """a long random schedule of appends of 1 to 5 tokens to sequences in turns, frees and new sequences in a pool just large enough, each read back and attended to against SDPA"""
    H, Hkv, hd, bs = fresh_dims(case_rng)
    dtype = torch.float64
    lengths, ops, peak, next_id = {0: 0, 1: 0, 2: 0}, [], 0, 3
    for step in range(40):
        live = sorted(lengths)
        held = [x for x in live if lengths[x]]
        if step % 9 == 8 and held:   # free a sequence, start a new one in its blocks
            gone = int(case_rng.choice(held))
            ops += [("free", gone)]
            del lengths[gone]
            lengths[next_id], next_id = 0, next_id + 1
            continue
        s = int(case_rng.choice(live))
        t = int(case_rng.integers(1, 6))
        ops.append(("append", s, *tokens(rng, t, Hkv, hd, dtype)))
        lengths[s] += t
        peak = max(peak, sum(ceil_div(n, bs) for n in lengths.values()))
        ops += [("gather", s), ("blocks", s)]
        if step % 4 == 3:
            ops.append(attend(case_rng, rng, [x for x, n in lengths.items() if n], H, hd, dtype))
    # Every sequence topped up to a whole number of blocks, then one token more to the first: each
    # schedule reads back both a full last block and a partial one, whatever was drawn before.
    for s in sorted(lengths):
        t = -lengths[s] % bs or bs
        ops += [("append", s, *tokens(rng, t, Hkv, hd, dtype)), ("gather", s), ("blocks", s)]
        lengths[s] += t
        peak = max(peak, sum(ceil_div(n, bs) for n in lengths.values()))
    first = min(lengths)
    ops += [("append", first, *tokens(rng, 1, Hkv, hd, dtype)), ("gather", first), ("blocks", first)]
    lengths[first] += 1
    peak = max(peak, sum(ceil_div(n, bs) for n in lengths.values()))
    ops += [("num_free",), attend(case_rng, rng, lengths, H, hd, dtype)]
    config = (peak, bs, Hkv, hd, "float64")
    case = config_text(config) + (f": a pool just large enough; q (B, {H}, {hd}); a random schedule of appends, "
                                  "frees and new sequences")
    drive(learner, bugs, kata, device, config, ops, case, attend=attention_judge(kata, device, case))


def test_fresh_beam_forks(learner, bugs, kata, case_rng, rng, device):
    """beam search: a prompt forked into beams, beams forked again and freed in random order, every beam appending after each fork (copy on write), each read back and attended to against SDPA"""
    H, Hkv, hd, bs = fresh_dims(case_rng)
    dtype = torch.float64
    prompt = int(case_rng.integers(bs + 1, 4 * bs))
    ops = [("append", 0, *tokens(rng, prompt, Hkv, hd, dtype))]
    lengths, next_id, bound = {0: prompt}, 1, ceil_div(prompt, bs)
    for step in range(8):
        for src in [int(s) for s in case_rng.permutation(sorted(lengths))[:2]]:   # two beams branch
            ops.append(("fork", src, next_id))
            lengths[next_id], next_id = lengths[src], next_id + 1
        while len(lengths) > 4:   # the worst beams are dropped
            gone = int(case_rng.choice(sorted(lengths)))
            ops.append(("free", gone))
            del lengths[gone]
        for s in [int(x) for x in case_rng.permutation(sorted(lengths))]:   # every beam takes a token
            ops.append(("append", s, *tokens(rng, 1, Hkv, hd, dtype)))
            lengths[s] += 1
        bound = max(bound, sum(ceil_div(n, bs) for n in lengths.values()))
        ops += [op for s in sorted(lengths) for op in (("gather", s), ("blocks", s))]
        ops += [("num_free",), attend(case_rng, rng, lengths, H, hd, dtype)]
    config = (bound, bs, Hkv, hd, "float64")
    case = config_text(config) + f": a prompt of {prompt} tokens; q (B, {H}, {hd}); 8 steps of beam search, 4 beams"
    drive(learner, bugs, kata, device, config, ops, case, attend=attention_judge(kata, device, case))
