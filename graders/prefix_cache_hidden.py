"""Hidden checks of the prefix-cache kata: scripts no public check shows, never in a student bundle."""
from graders.prefix_cache import config_text, drive, request, streams


def test_fresh_request_stream(learner, bugs, case_rng):
    """a long random stream of requests in a small pool: shared system prompts cut at any length, multi-turn chats that resend their history, extra keys, frees in any order, every block reused"""
    bs = int(case_rng.integers(2, 5))
    num_blocks = 16
    t = streams(case_rng, s0=6 * bs, s1=5 * bs, s2=4 * bs, **{f"u{i}": 4 * bs for i in range(40)})
    ops, running, chats = [], {}, []   # running: request id -> the blocks it holds, at most
    for i in range(40):
        kind = int(case_rng.integers(0, 3))
        if kind == 0 or not chats:   # a new request under a system prompt, cut anywhere
            s = f"s{int(case_rng.integers(0, 3))}"
            parts = [(s, 0, int(case_rng.integers(1, len(t[s]) + 1))),
                     (f"u{i}", 0, int(case_rng.integers(1, 2 * bs + 1)))]
        elif kind == 1:   # a chat's next turn: its whole history and a new message
            parts = list(chats[int(case_rng.integers(0, len(chats)))])
            parts.append((f"u{i}", 0, int(case_rng.integers(1, 2 * bs + 1))))
        else:   # a chat's history sent again, cut at a random length: a regenerated answer
            history = chats[int(case_rng.integers(0, len(chats)))]
            parts = list(history[:int(case_rng.integers(1, len(history) + 1))])
        extra = None if case_rng.random() < 0.8 else (f"lora-{int(case_rng.integers(1, 3))}",)
        n = sum(stop - start for _, start, stop in parts)
        need = -(-n // bs)
        if need > num_blocks:
            continue
        # Free until the request fits whatever it hits: then no allocate runs out of blocks.
        while sum(running.values()) + need > num_blocks or len(running) >= 4:
            gone = sorted(running)[int(case_rng.integers(0, len(running)))]
            ops.append(("free", gone))
            del running[gone]
        rid = f"r{i}"
        ops.append(request(rid, t, *parts, extra=extra))
        running[rid] = need
        if extra is None and len(parts) < 6:
            chats.append(tuple(parts))
        if i % 5 == 4:
            ops.append(("refcounts", rid))
    case = config_text((num_blocks, bs)) + ("; 40 requests drawn at random, at most 4 running, tokens from 3 system "
                                             "prompts and each request's own")
    drive(learner, bugs, (num_blocks, bs), ops, case)
