"""Grader of the prefix-cache kata (katas/prefix-cache/README.md).

Every cache check drives a learner PrefixCache through a script of requests, ``ops``, and judges
what the cache answers as it answers: num_cached_tokens, the blocks each request holds, reference
counts, a full pool's RuntimeError, against the reference's answers to the same script. Block ids
are the cache's own: the grader names each block by the order it was first handed out (b0 the
first), so it compares only which requests share a block and which freed block is taken again,
never an id's value. A failure is named by the bug whose cache answers the script the same way up
to there. Prompts are built from token streams drawn by ``case_rng``: token ids are the cases'
structure, the same at every seed.
"""
from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.learner import describe_value
from graders.engine.recording import recorded
from graders.engine.structure import check_untampered

VOCAB = 32_000   # token ids are drawn from range(VOCAB)


def streams(case_rng, **lengths):
    """Named token streams, ``{name: [ids]}``, each of its length, distinct ids within a stream."""
    return {name: [int(t) for t in case_rng.choice(VOCAB, size=n, replace=False)] for name, n in lengths.items()}


def prompt(tokens, *parts):
    """A prompt made of slices of the streams: (its tokens, how it reads, e.g. "sys[0:8] + q1[0:5]")."""
    ids = [t for name, start, stop in parts for t in tokens[name][start:stop]]
    return ids, " + ".join(f"{name}[{start}:{stop}]" for name, start, stop in parts)


def request(rid, tokens, *parts, extra=None):
    """An "allocate" op: request ``rid`` with the prompt made of ``parts``."""
    ids, text = prompt(tokens, *parts)
    return ("allocate", rid, ids, extra, text)


def full(rid, tokens, *parts, extra=None):
    """An allocate that must raise RuntimeError and change nothing: the free queue is too short."""
    return ("full",) + request(rid, tokens, *parts, extra=extra)[1:]


# --- the script, run on a trusted cache -------------------------------------------------------

def names_of(names, blocks):
    """Each block id as the order it was first handed out: ``names`` maps the ids seen so far."""
    for b in blocks:
        names.setdefault(b, len(names))
    return [names[b] for b in blocks]


def step(cache, names, held, op):
    """What a cache answers to one op: [block names, num_cached_tokens] to "allocate", reference
    counts of a request's blocks (running or not) to "refcounts", "RuntimeError" or "allocated" to
    "full", None to "free"."""
    kind = op[0]
    if kind == "allocate":
        blocks, cached = cache.allocate(op[1], op[2], op[3])
        held[op[1]] = list(blocks)
        return [names_of(names, blocks), cached]
    if kind == "full":
        try:
            cache.allocate(op[1], op[2], op[3])
        except RuntimeError:
            return "RuntimeError"
        return "allocated"
    if kind == "free":
        cache.free(op[1])
        return None
    if kind == "refcounts":
        return [cache.refcount(b) for b in held[op[1]]]
    raise ValueError(f"unknown op {kind}")


@recorded
def cache_trace(cache_cls, config, ops):
    """What a trusted cache (the reference's or a bug's), ``cache_cls(num_blocks, block_size)``,
    answers to ``ops`` in order; "raised KeyError" (the exception's type) for the first op that
    raises, and nothing after."""
    cache, names, held, trace = cache_cls(*config), {}, {}, []
    for op in ops:
        try:
            trace.append(step(cache, names, held, op))
        except Exception as exc:
            trace.append(f"raised {type(exc).__name__}")
            break
    return trace


@recorded
def hash_trace(hash_fn, calls, facts):
    """What a trusted block_hash answers: for each fact (i, j, same) of ``facts``, whether hashes i
    and j of ``calls`` are equal (1) or not (0). A call (parent, tokens, extra) names its parent by
    the index of an earlier call, or None."""
    hashes = []
    for parent, tokens, extra in calls:
        hashes.append(hash_fn(None if parent is None else hashes[parent], tokens, extra))
    return [int(hashes[i] == hashes[j]) for i, j, _ in facts]


# --- the learner's cache, judged op by op ----------------------------------------------------

def op_text(op) -> str:
    kind = op[0]
    if kind in ("allocate", "full"):
        extra = "" if op[3] is None else f", extra_keys={op[3]!r}"
        return f"cache.allocate({op[1]!r}, {op[4]}{extra})"
    if kind == "free":
        return f"cache.free({op[1]!r})"
    return f"[cache.refcount(b) for b in blocks of {op[1]!r}]"


def history(ops) -> str:
    done = [f"{'allocate' if op[0] == 'allocate' else 'free'} {op[1]}" for op in ops if op[0] in ("allocate", "free")]
    if len(done) > 12:
        done = done[:3] + [f"... {len(done) - 6} more ..."] + done[-3:]
    return ", ".join(done) or "nothing"


def shown(observation) -> str:
    """An allocate's answer as the learner reads it: "blocks [b0, b1, b4], 8 tokens cached"."""
    if type(observation) is list and len(observation) == 2 and type(observation[0]) is list:
        return f"blocks [{', '.join(f'b{n}' for n in observation[0])}], {observation[1]} tokens cached"
    return repr(observation)


def learner_allocate(cache, op):
    """The learner's allocate, its answer checked for form and put as step() puts it."""
    got = cache.allocate(op[1], op[2], op[3])
    pair = type(got) in (tuple, list) and len(got) == 2
    blocks = list(got[0]) if pair and type(got[0]) in (list, tuple) else None
    return got, (blocks is not None and all(type(b) is int for b in blocks) and type(got[1]) is int), blocks


BLOCKS = ("Blocks are named here by when the cache first handed them out (b0 the first): a request holds its hits "
          "first, then blocks from the free queue's head, never-used blocks before freed ones, then the freed ones "
          "least recently freed first, a request's blocks freed last block first.")
MESSAGES = {
    "cached": "num_cached_tokens is block_size times the hits: the longest run of the prompt's full blocks, from "
              "the first, whose chained hashes are cached, never the block of the prompt's last token.",
    "count": "A request holds ceil(len(tokens) / block_size) blocks: its full blocks and a partial last one.",
    "blocks": "The request holds other blocks than the contract gives it. " + BLOCKS,
    "refcounts": "refcount(b) counts the running requests that hold block b: 0 once none does.",
    "full": "allocate must raise RuntimeError when the free queue cannot supply the blocks a prompt needs (hits "
            "in the free queue leave it too), and change nothing.",
}


def drive(learner, bugs, config, ops, case):
    """Run ``ops`` on a fresh learner PrefixCache and judge each answer against the reference's
    as it comes; a failure is named by the bug whose cache answers the same way up to there."""
    cache = learner.PrefixCache(*config)
    want = cache_trace(bugs.reference.PrefixCache, config, tuple(ops))
    names, held, trace = {}, {}, []
    diagnose = lambda: bugs.match(trace, lambda impl: cache_trace(impl.PrefixCache, config, tuple(ops))[:len(trace)],
                                  rtol=0, atol=0)
    for i, op in enumerate(ops):
        kind = op[0]
        call = op_text(op) + f"   (after {history(ops[:i])})"
        try:
            if kind == "allocate":
                got, ok, blocks = learner_allocate(cache, op)
                expect.that(ok, "allocate must return (block_ids, num_cached_tokens): a list of int block ids "
                            "and an int.", call=call, case=case, got=describe_value(got),
                            expected="a tuple (list of ints, int)")
                held[op[1]] = blocks
                answer = [names_of(names, blocks), got[1]]
            elif kind == "full":
                try:
                    cache.allocate(op[1], op[2], op[3])
                    answer = "allocated"
                except LearnerRaised as exc:
                    if exc.type_name != "RuntimeError":
                        raise
                    answer = "RuntimeError"
            elif kind == "free":
                cache.free(op[1])
                answer = None
            else:
                answer = [cache.refcount(b) for b in held[op[1]]]
        except LearnerRaised as exc:
            if exc.type_name is None:   # the method itself is missing: report that as it is
                raise
            trace.append(f"raised {exc.type_name}")
            exc.call, exc.case = exc.call or call, exc.case or case
            exc.diagnosis = exc.diagnosis or diagnose()
            raise
        trace.append(answer)
        expected = want[i]
        if answer == expected:
            continue
        if kind == "allocate" and type(expected) is list:
            what = ("count" if len(answer[0]) != len(expected[0]) else "cached" if answer[1] != expected[1]
                    else "blocks")
        else:
            what = kind
        expect.fail(MESSAGES[what], call=call, case=case, got=shown(answer), expected=shown(expected),
                    diagnose=diagnose)


def config_text(config) -> str:
    return f"cache = PrefixCache(num_blocks={config[0]}, block_size={config[1]})"


# --- block_hash ------------------------------------------------------------------------------

def hash_case(case_rng):
    """Calls of block_hash, (parent index or None, tokens, extra_keys), and the facts about them,
    (i, j, same, why): equal inputs give equal hashes, any difference a different one."""
    t = streams(case_rng, a=4, b=4)
    a, b = t["a"], t["b"]
    a_changed = a[:3] + [(a[3] + 1) % VOCAB]
    calls = [
        (None, a, None),                   # 0
        (None, list(a), None),             # 1: the same inputs again
        (0, b, None),                      # 2: b after a
        (None, b, None),                   # 3: b first
        (None, a_changed, None),           # 4
        (4, b, None),                      # 5: b after another parent
        (None, a[::-1], None),             # 6: a's tokens in reverse order
        (None, a, ("lora-7",)),            # 7
        (None, a, ("lora-7",)),            # 8
        (None, a, ("lora-8",)),            # 9
        (7, b, ("lora-7",)),               # 10
        (None, [12, 3, 45, 6], None),      # 11
        (None, [1, 23, 4, 56], None),      # 12: the same digits, other tokens
        (None, a, ("salt", 1)),            # 13
        (None, a, ("salt", 2)),            # 14
    ]
    facts = [
        (0, 1, True, "the same tokens, no parent: the same hash"),
        (2, 3, False, "b after a and b as the first block: a hash stands for the whole prefix"),
        (2, 5, False, "b after two different parents"),
        (0, 4, False, "tokens that differ in the last one"),
        (0, 6, False, "the same tokens in another order"),
        (11, 12, False, "[12, 3, 45, 6] and [1, 23, 4, 56]: the same digits, other tokens"),
        (0, 7, False, "extra_keys ('lora-7',) and None"),
        (7, 8, True, "the same extra_keys"),
        (7, 9, False, "extra_keys ('lora-7',) and ('lora-8',)"),
        (13, 14, False, "extra_keys ('salt', 1) and ('salt', 2)"),
        (2, 10, False, "b after a, without and with extra_keys"),
    ]
    return calls, facts


def test_block_hash_chained(learner, bugs, case_rng):
    """block_hash: equal inputs give equal hashes; another parent, other tokens (or the same in another order) or other extra keys give another hash; it returns an int or a str"""
    calls, facts = hash_case(case_rng)
    spec = tuple((parent, tuple(tokens), extra) for parent, tokens, extra in calls)
    want = hash_trace(bugs.reference.block_hash, spec, tuple(f[:3] for f in facts))
    hashes, texts = [], []
    for parent, tokens, extra in calls:
        parent_text = "None" if parent is None else f"h{parent}"
        text = f"h{len(hashes)} = block_hash({parent_text}, {tokens}" + ("" if extra is None else f", {extra!r}") + ")"
        got = learner.block_hash(None if parent is None else hashes[parent], list(tokens), extra)
        expect.that(type(got) in (int, str), "block_hash must return an int or a str (a sha256 hex digest will do): "
                    "a plain value, so that the grader can compare two hashes.", call=text, got=describe_value(got),
                    expected="an int or a str")
        hashes.append(got)
        texts.append(text)
    trace = []
    for (i, j, same, why), expected in zip(facts, want):
        trace.append(int(hashes[i] == hashes[j]))
        if trace[-1] != expected:
            expect.fail(f"{why}: block_hash must give {'equal' if same else 'different'} hashes.",
                        call=f"h{i} == h{j}", case="; ".join(texts[k] for k in sorted({i, j} | {
                            p for p in (calls[i][0], calls[j][0]) if p is not None})),
                        got=f"{'equal' if trace[-1] else 'different'} hashes ({hashes[i]!r} and {hashes[j]!r})",
                        expected=f"{'equal' if same else 'different'} hashes",
                        diagnose=lambda: bugs.match(trace, lambda impl: hash_trace(
                            impl.block_hash, spec, tuple(f[:3] for f in facts))[:len(trace)], rtol=0, atol=0))


# --- the cache checks --------------------------------------------------------------------------

def test_hits_on_shared_prefix(learner, bugs, case_rng):
    """requests that share a system prompt hit its full blocks (never a partial block, never the block of the last token), concurrent requests share blocks with one reference each, and the same tokens after another prefix miss"""
    t = streams(case_rng, sys=16, u1=8, u2=8, u3=8)
    config = (32, 4)
    ops = [request("a", t, ("sys", 0, 12), ("u1", 0, 6)), request("b", t, ("sys", 0, 12), ("u2", 0, 3)),
           ("refcounts", "a"), request("c", t, ("sys", 0, 10)), request("d", t, ("sys", 0, 12), ("u1", 0, 6)),
           request("e", t, ("sys", 0, 12), ("u1", 0, 4)), ("refcounts", "a"), ("refcounts", "e"),
           request("f", t, ("sys", 4, 8), ("sys", 0, 4), ("u3", 0, 2)), ("refcounts", "f")]
    case = config_text(config) + "; prompts sharing the 16 tokens of sys, all requests running"
    drive(learner, bugs, config, ops, case)


def test_freed_blocks_stay_cached(learner, bugs, case_rng):
    """a finished request's blocks keep their hashes in the free queue: a later request with the same prefix hits them, and a block a running request shares keeps its other reference when one request ends"""
    t = streams(case_rng, sys=8, u1=12, u2=4)
    config = (16, 4)
    ops = [request("a", t, ("sys", 0, 8), ("u1", 0, 5)), ("free", "a"), ("refcounts", "a"),
           request("b", t, ("sys", 0, 8), ("u1", 0, 9)), ("refcounts", "b"),
           request("c", t, ("sys", 0, 8), ("u2", 0, 2)),
           ("refcounts", "b"), ("free", "b"), ("refcounts", "c"), ("free", "c"), ("refcounts", "b"),
           request("d", t, ("sys", 0, 8), ("u1", 0, 9)), request("e", t, ("sys", 0, 8), ("u2", 0, 3)),
           ("refcounts", "d")]
    case = config_text(config) + "; a request ends, then others with its prefix arrive"
    drive(learner, bugs, config, ops, case)


def test_lru_eviction(learner, bugs, case_rng):
    """a small pool: new blocks come from the free queue's head, never-used blocks first, then the least recently freed (a request's last block first), and the hash an evicted block held is gone: its prefix misses"""
    t = streams(case_rng, A=12, B=12, C=16, D=4, E=4, F=4)
    config = (8, 4)
    ops = [request("a", t, ("A", 0, 12)), ("free", "a"), request("b", t, ("B", 0, 12)), ("free", "b"),
           request("c", t, ("C", 0, 16)), ("free", "c"), request("d", t, ("A", 0, 12), ("D", 0, 3)),
           request("e", t, ("B", 0, 12), ("E", 0, 1)), ("free", "d"), ("free", "e"),
           request("f", t, ("C", 0, 16), ("F", 0, 2)), request("g", t, ("A", 0, 8), ("D", 0, 3)),
           ("refcounts", "f")]
    case = config_text(config) + "; one request at a time, each freed before the next, so that every block is reused"
    drive(learner, bugs, config, ops, case)


def test_referenced_blocks_never_evicted(learner, bugs, case_rng):
    """a block a running request holds is never taken for another request, though it was in the free queue when it was hit or another holder ended; a pool with too few free blocks raises RuntimeError and changes nothing"""
    t = streams(case_rng, S=8, A=4, B=4, C=20, D=4, E=24)
    config = (8, 4)
    # x needs 6 blocks where 5 are free, y 1 where none is: an allocate that takes blocks before it
    # finds too few leaves the next requests short.
    ops = [request("a", t, ("S", 0, 8), ("A", 0, 4)), ("free", "a"), request("b", t, ("S", 0, 8), ("B", 0, 2)),
           request("c", t, ("S", 0, 8), ("D", 0, 1)), ("refcounts", "b"), ("free", "c"), full("x", t, ("E", 0, 24)),
           ("refcounts", "b"), request("d", t, ("C", 0, 17)), ("refcounts", "b"), full("y", t, ("E", 0, 3)),
           ("refcounts", "b"), ("free", "d"), request("z", t, ("E", 0, 8)), ("refcounts", "b")]
    case = config_text(config) + "; requests sharing the 8 tokens of S, in a pool that fills up"
    drive(learner, bugs, config, ops, case)


def test_extra_keys_separate(learner, bugs, case_rng):
    """the same tokens under other extra keys (another LoRA adapter, another tenant's cache salt) miss; under the same extra keys they hit"""
    t = streams(case_rng, S=12, q=4)
    config = (32, 4)
    ops = [request("a", t, ("S", 0, 9), extra=("lora-1",)), request("b", t, ("S", 0, 9), extra=("lora-2",)),
           request("c", t, ("S", 0, 9)), request("d", t, ("S", 0, 9), ("q", 0, 2), extra=("lora-1",)),
           request("e", t, ("S", 0, 12), ("q", 0, 1), extra=("salt", 7)), request("f", t, ("S", 0, 10)),
           request("g", t, ("S", 0, 12), ("q", 0, 3), extra=("salt", 7)), ("refcounts", "a")]
    case = config_text(config) + "; one prompt under several extra_keys, all requests running"
    drive(learner, bugs, config, ops, case)


# The memory check: a pool of 64 blocks of 4 tokens, and prompts of 256 distinct tokens, each
# filling the whole pool, allocated and freed one after the other: every block is evicted and
# cached again under a new hash at each request. A cache keeps at most one hash per block; one
# that keeps the hashes of evicted blocks (or the prompts it was given) holds 64 more a request,
# over 200 requests 12,800 of them, about 1.5 MiB or more, as the kernel counts the sandbox's pages.
MEMORY = {"num_blocks": 64, "block_size": 4, "warm_up": 40, "requests": 200}


def test_pool_never_grows(learner, case_rng):
    """a long stream of distinct prompts, each filling the pool: the cache's memory stays that of its pool, since an evicted block's hash is dropped"""
    m = MEMORY
    n_tokens = m["num_blocks"] * m["block_size"]
    drawn = case_rng.integers(0, VOCAB, size=(m["warm_up"] + m["requests"], n_tokens))
    prompts = [[int(x) for x in row] for row in drawn]
    cache = learner.PrefixCache(m["num_blocks"], m["block_size"])

    def stream(rows):
        for i, tokens in rows:
            cache.allocate(f"r{i}", tokens)
            cache.free(f"r{i}")

    # The warm-up runs every code path and fills the pool's hashes once; what the second stream
    # adds to the sandbox's resident memory is what the cache keeps of evicted prompts.
    stream(enumerate(prompts[:m["warm_up"]]))
    before = learner.resident_bytes()
    stream(list(enumerate(prompts))[m["warm_up"]:])
    after = learner.resident_bytes()
    grown = None if None in (before, after) else after - before
    case = (f"{config_text((m['num_blocks'], m['block_size']))}; {m['warm_up']} prompts of {n_tokens} distinct "
            f"tokens, each allocated and freed, then {m['requests']} more")
    call = "resident memory of the sandbox, as the kernel counts it"
    limit = 512 << 10
    expect.that(grown is None or grown <= limit, f"After {m['requests']} prompts that each fill the pool, the sandbox "
                "holds more memory: the cache keeps what it evicted (the hashes of blocks taken for other tokens, or "
                "the prompts). A block taken from the free queue drops the hash it held; a request's record goes "
                "when it is freed.", call=call, case=case,
                got=f"{grown:,} bytes more after the {m['requests']} prompts",
                expected=f"at most {limit:,} bytes (a pool's 64 hashes and the interpreter's own allocations)")
    check_untampered(learner, call=call, case=case)
