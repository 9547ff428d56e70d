"""Grader of the paged-kv kata (katas/paged-kv/README.md).

Every check drives a learner cache through a script of operations, ``ops``, and judges what the
cache answers to the ones that observe it, as it answers: what ``gather`` reads back against the
tokens the grader appended (exactly), the counts of blocks against the reference's, attention
against F.scaled_dot_product_attention. Block ids are the learner's own: the grader compares only
what any right allocator answers alike (how many blocks, reference counts, two tables equal).
A failure is named by the bug whose cache answers the same script the same way up to there.
"""
import functools

import torch
import torch.nn.functional as F

from graders.engine import expect
from graders.engine.failures import LearnerRaised
from graders.engine.learner import describe_value
from graders.engine.recording import NotRecorded, recorded
from graders.engine.structure import banned_used, check_untampered
from graders.engine.weights import normal

SDPA = "F.scaled_dot_product_attention(q, k, v, enable_gqa=True) over each sequence's tokens, in float64"


def ceil_div(n, d):
    return -(-n // d)


def tokens(rng, t, Hkv, hd, dtype=torch.float64):
    """(t, n_kv_heads, head_dim) keys and values, standard normal."""
    return normal(rng, t, Hkv, hd).to(dtype), normal(rng, t, Hkv, hd).to(dtype)


def appends(rng, turns, Hkv, hd, dtype=torch.float64):
    """("append", seq_id, k, v) ops, one per (seq_id, t) of ``turns``."""
    return [("append", s, *tokens(rng, t, Hkv, hd, dtype)) for s, t in turns]


# --- the script, run on a trusted cache --------------------------------------------------------

def observe(cache, attention, op):
    """What a cache answers to one op: None to the ops that change it, else the observation."""
    kind = op[0]
    if kind in ("append", "fork", "free"):
        getattr(cache, kind)(*op[1:])
        return None
    if kind == "full":   # an append that must raise RuntimeError and change nothing
        try:
            cache.append(op[1], op[2], op[3])
        except RuntimeError:
            return "RuntimeError"
        return "appended"
    if kind == "gather":
        k, v = cache.gather(op[1])
        return k.cpu().clone(), v.cpu().clone()
    if kind == "len":
        return cache.seq_len(op[1])
    if kind == "blocks":
        return len(cache.block_table(op[1]))
    if kind == "num_free":
        return cache.allocator.num_free()
    if kind == "refcounts":
        return [cache.allocator.refcount(b) for b in cache.block_table(op[1])]
    if kind == "same_table":
        return int(list(cache.block_table(op[1])) == list(cache.block_table(op[2])))
    if kind == "attend":
        return attention(op[1], cache, list(op[2])).cpu()
    raise ValueError(f"unknown op {kind}")


@recorded
def paged_trace(cache_cls, attention, config, ops):
    """What a trusted cache (the reference's or a bug's), built as ``cache_cls(*config)`` on the
    CPU, answers to ``ops``, in order; "raised IndexError" (the exception's type) for the first op
    that raises, and nothing after."""
    num_blocks, block_size, Hkv, hd, dtype = config
    cache = cache_cls(num_blocks, block_size, Hkv, hd, dtype=getattr(torch, dtype))
    trace = []
    for op in ops:
        try:
            trace.append(observe(cache, attention, op))
        except Exception as exc:
            trace.append(f"raised {type(exc).__name__}")
            break
    return trace


COUNTS = ("len", "blocks", "num_free", "refcounts", "same_table", "full")


def rest_of_script(learner, cache, ops, start):
    """What the learner's cache answers to ``ops[start:]`` after a failure, unjudged, as observe()
    gives it: the counts and what gather reads back; None for the ops that change the cache and for
    attention (not needed to tell two caches apart), and "raised ..." for the first op that raises,
    and nothing after."""
    rest = []
    for op in ops[start:]:
        if op[0] == "attend":
            rest.append(None)
            continue
        try:
            got = learner_answer(learner, cache, op)
        except LearnerRaised as exc:
            rest.append(f"raised {exc.type_name}")
            break
        if op[0] == "gather":
            got = tuple(x.cpu() if type(x) is torch.Tensor else x for x in got) if type(got) is tuple else got
        rest.append(got if op[0] in COUNTS + ("gather",) else None)
    return rest


def agrees(ops, got, want, tol) -> bool:
    """Whether two traces (from the same op on) read back and count alike, and raise at the same op."""
    for op, a, b in zip(ops, got, want):
        raised = any(type(x) is str and x.startswith("raised") for x in (a, b))
        if (raised or op[0] in COUNTS) and not (type(a) is type(b) and a == b):
            return False
        if op[0] == "gather" and not raised and not expect.same(a, b, **tol):
            return False
    return True


@recorded
def allocator_trace(allocator_cls, ops):
    """What a trusted BlockAllocator(4, 2) answers to ``ops`` (see ALLOCATOR_OPS)."""
    allocator, held, trace = allocator_cls(4, 2), {}, []
    for op in ops:
        try:
            trace.append(allocator_step(allocator, held, op))
        except Exception:
            trace.append("raised")
            break
    return trace


# The allocator check, on BlockAllocator(4, 2): block ids are the allocator's own, so the script
# names them by the order they were handed out ("a0" the first) and observes only counts and
# whether a block handed out again is the one freed.
ALLOCATOR_OPS = (
    ("allocate", "a0"), ("num_free",), ("allocate", "a1"), ("allocate", "a2"), ("allocate", "a3"), ("num_free",),
    ("distinct",), ("full",), ("incref", "a1"), ("incref", "a1"), ("refcount", "a1"), ("free", "a1"),
    ("refcount", "a1"), ("num_free",), ("free", "a1"), ("refcount", "a1"), ("num_free",), ("free", "a1"),
    ("refcount", "a1"), ("num_free",), ("allocate", "b"), ("same", "b", "a1"), ("refcount", "b"), ("num_free",),
    ("free", "a3"), ("free", "a0"), ("num_free",), ("refcount", "a2"),
)


def allocator_call(op) -> str:
    kind = op[0]
    if kind == "allocate":
        return f"{op[1]} = allocator.allocate()"
    if kind in ("incref", "free", "refcount"):
        return f"allocator.{kind}({op[1]})"
    if kind == "same":
        return f"{op[1]} == {op[2]}"
    return {"num_free": "allocator.num_free()", "distinct": "a0, a1, a2, a3",
            "full": "allocator.allocate() with no block free"}[kind]


def allocator_step(allocator, held, op):
    kind = op[0]
    if kind == "allocate":
        held[op[1]] = allocator.allocate()
        return None
    if kind == "num_free":
        return allocator.num_free()
    if kind == "distinct":   # the first four ids: distinct, and ids of the pool
        ids = [held[f"a{i}"] for i in range(4)]
        return int(len(set(ids)) == 4 and all(type(b) is int and 0 <= b < 4 for b in ids))
    if kind == "full":
        try:
            allocator.allocate()
        except RuntimeError:
            return "RuntimeError"
        return "allocated"
    if kind in ("incref", "free"):
        getattr(allocator, kind)(held[op[1]])
        return None
    if kind == "refcount":
        return allocator.refcount(held[op[1]])
    if kind == "same":
        return int(held[op[1]] == held[op[2]])
    raise ValueError(f"unknown op {kind}")


# --- the learner's cache, judged op by op ------------------------------------------------------

def op_text(op) -> str:
    kind = op[0]
    if kind in ("append", "full"):
        return f"append({op[1]}, {op[2].shape[0]} token{'s' * (op[2].shape[0] > 1)})"
    if kind == "fork":
        return f"fork({op[1]}, {op[2]})"
    if kind == "free":
        return f"free({op[1]})"
    return ""


def history(ops) -> str:
    done = [op_text(op) for op in ops if op_text(op)]
    if len(done) > 14:
        done = done[:4] + [f"... {len(done) - 8} more ..."] + done[-4:]
    return ", ".join(done) or "nothing"


def config_text(config) -> str:
    num_blocks, block_size, Hkv, hd, dtype = config
    return (f"cache = PagedKVCache({num_blocks}, {block_size}, {Hkv}, {hd}, torch.{dtype}); tokens (t, {Hkv}, {hd}), "
            f"{dtype} standard normal")


class Sequences:
    """What each sequence must hold, kept by the grader as the tokens it was given."""

    def __init__(self):
        self.k, self.v = {}, {}

    def apply(self, op):
        kind = op[0]
        if kind == "append":
            self.k[op[1]] = self.k.get(op[1], []) + [op[2]]
            self.v[op[1]] = self.v.get(op[1], []) + [op[3]]
        elif kind == "fork":
            self.k[op[2]], self.v[op[2]] = list(self.k[op[1]]), list(self.v[op[1]])
        elif kind == "free":
            del self.k[op[1]], self.v[op[1]]

    def tokens(self, seq_id):
        return torch.cat(self.k[seq_id]), torch.cat(self.v[seq_id])   # (L, Hkv, hd) each

    def length(self, seq_id):
        return sum(k.shape[0] for k in self.k[seq_id])


def learner_answer(learner, cache, op):
    """What the learner's cache answers to one op, in the form observe() gives (ints, lists of
    ints, "RuntimeError"), where the learner's answer has that form; else the answer itself."""
    kind = op[0]
    if kind in ("append", "fork", "free"):   # what they return is not judged
        getattr(cache, kind)(*op[1:])
        return None
    if kind == "full":
        try:
            cache.append(op[1], op[2], op[3])
        except LearnerRaised as exc:
            if exc.type_name != "RuntimeError":
                raise
            return "RuntimeError"
        return "appended"
    if kind == "gather":
        return cache.gather(op[1])
    if kind == "len":
        return cache.seq_len(op[1])
    if kind == "num_free":
        return cache.allocator.num_free()
    if kind == "attend":
        return learner.paged_attention(op[1], cache, list(op[2]))
    tables = [cache.block_table(s) for s in op[1:]]
    if not all(isinstance(t, (list, tuple)) for t in tables):
        return tables[0]
    if kind == "blocks":
        return len(tables[0])
    if kind == "refcounts":
        return [cache.allocator.refcount(b) for b in tables[0]]
    return int(list(tables[0]) == list(tables[1]))   # same_table


OP_CALLS = {"gather": "cache.gather({})", "len": "cache.seq_len({})", "blocks": "len(cache.block_table({}))",
            "num_free": "cache.allocator.num_free()",
            "refcounts": "[cache.allocator.refcount(b) for b in cache.block_table({})]",
            "same_table": "cache.block_table({}) == cache.block_table({})"}
MESSAGES = {
    "len": "seq_len(seq_id) must be the number of tokens appended to the sequence.",
    "blocks": "A sequence of L tokens holds ceil(L / block_size) blocks, its last one holding 1 to block_size tokens.",
    "num_free": "num_free() must be the pool's blocks less those the sequences hold (a shared block counted once).",
    "refcounts": "Each block of a table must have one reference per sequence whose table holds it.",
    "same_table": "fork(src, dst) gives dst src's blocks, the same ids in the same order.",
    "full": "append must raise RuntimeError when the pool has too few free blocks for it, and change nothing.",
}


def drive(learner, bugs, kata, device, config, ops, case, *, attend=None):
    """Run ``ops`` on a fresh learner PagedKVCache and judge each observation as it comes:
    gathers exactly against the tokens appended, counts against the reference, "attend" ops by
    ``attend(cache, got, op, seqs, expected, call, diagnose)``. A failure is named by the bug
    whose cache answers the same ops the same way up to there."""
    num_blocks, block_size, Hkv, hd, dtype = config
    cache = learner.PagedKVCache(num_blocks, block_size, Hkv, hd, getattr(torch, dtype), device)
    compute = lambda impl: paged_trace(impl.PagedKVCache, impl.paged_attention, config, tuple(ops))
    reference_trace = functools.cache(lambda: compute(bugs.reference))   # the reference's whole trace, replayed once
    trace, seqs = [], Sequences()

    def diagnose():
        """The first bug whose cache answers the ops as the learner's did up to the failure, and
        then the rest of the script (its counts and reads) as the learner's does: two bugs can read
        the same wrong tokens at first, and only what comes after (a copy made or not, where later
        tokens land) tells them apart."""
        tol, failed_at, rest = kata.tolerance("float32"), len(trace), None
        among = list(bugs.codes)
        while among:
            code = bugs.match(trace, lambda impl: compute(impl)[:failed_at], among=among, **tol)
            if code is None:
                return None
            if rest is None:   # after a raise the learner's cache is in no state to go on
                raised = type(trace[-1]) is str and trace[-1].startswith("raised ")
                rest = [] if raised else rest_of_script(learner, cache, ops, failed_at)
            for variant, impl in bugs.variants():
                theirs = compute(impl) if variant == code else None
                if theirs is not None and expect.same(trace, theirs[:failed_at], **tol) \
                        and agrees(ops[failed_at:], rest, theirs[failed_at:], tol):
                    return code
            among.remove(code)
        return None

    for i, op in enumerate(ops):
        kind = op[0]
        call = (OP_CALLS[kind].format(*op[1:]) if kind in OP_CALLS else
                "paged_attention(q, cache, seq_ids={})".format(list(op[2])) if kind == "attend" else
                op_text(op) + (" with too few free blocks" if kind == "full" else ""))
        call += f"   (after {history(ops[:i])})"
        try:
            got = learner_answer(learner, cache, op)
        except LearnerRaised as exc:
            if exc.type_name is None:   # the method itself is missing: report that as it is
                raise
            trace.append(f"raised {exc.type_name}")
            exc.call, exc.case = exc.call or call, exc.case or case
            try:
                exc.diagnosis = exc.diagnosis or diagnose()
            except NotRecorded:   # a student bundle without this oracle value: the failure stands
                pass
            raise
        seqs.apply(op)
        if kind in ("append", "fork", "free"):
            trace.append(None)
        elif kind == "gather":
            judge_gather(got, seqs.tokens(op[1]), op[1], trace, device=device, call=call, case=case,
                         diagnose=diagnose)
        elif kind == "attend":
            trace.append(got.cpu() if type(got) is torch.Tensor and got.device.type != "meta" else got)
            attend(cache, got, op, seqs, reference_trace()[i], call, diagnose)
        else:
            trace.append(got)
            want = reference_trace()[i]
            expected = (f"{want} = ceil({seqs.length(op[1])} / {block_size})" if kind == "blocks" else
                        str(bool(want)) if kind == "same_table" else str(want))
            shown = str(bool(got)) if kind == "same_table" and type(got) is int else repr(got)
            expect.that(type(got) is type(want) and got == want, MESSAGES[kind], call=call, case=case, got=shown,
                        expected=expected, diagnose=diagnose)
    return cache


def judge_gather(got, want, seq_id, trace, *, device, call, case, diagnose):
    """gather's pair: exactly the tokens appended to the sequence, in order, in the cache's dtype."""
    pair = type(got) is tuple and len(got) == 2
    trace.append(tuple(x.cpu() if type(x) is torch.Tensor else x for x in got) if pair else got)
    expect.that(pair, "gather(seq_id) must return the pair (k, v).", call=call, case=case, got=describe_value(got),
                expected=f"tuple (k, v), each {tuple(want[0].shape)}", diagnose=diagnose)
    for what, value, expected in (("k", got[0], want[0]), ("v", got[1], want[1])):
        expect.type_of(value, torch.Tensor, call=call, case=case, what=what)
        expect.that(tuple(value.shape) == tuple(expected.shape),
                    f"{what} has the wrong shape: the sequence holds {expected.shape[0]} tokens, and gather reads "
                    "them all, (L, n_kv_heads, head_dim).", call=call, case=case, got=f"shape {tuple(value.shape)}",
                    expected=f"shape {tuple(expected.shape)}", diagnose=diagnose)
        expect.array(value, expected, call=call, case=case, what=what, rtol=0, atol=0, device=device,
                     diagnose=diagnose, against=f"the {'keys' if what == 'k' else 'values'} appended to sequence "
                                                f"{seq_id}, in order")


def sdpa(q, seqs, seq_ids):
    """F.scaled_dot_product_attention over each sequence's tokens, one query each, in float64
    (B, H, hd); ``seqs`` maps a seq_id to its (k, v), (L, n_kv_heads, head_dim) each."""
    outs = []
    for b, s in enumerate(seq_ids):
        k, v = (t.double().transpose(0, 1) for t in seqs[s])   # (Hkv, L, hd)
        y = F.scaled_dot_product_attention(q[b].double().unsqueeze(1), k, v, enable_gqa=True)   # (H, 1, hd)
        outs.append(y.squeeze(1))
    return torch.stack(outs)   # (B, H, hd)


def own_gathers(cache, seq_ids):
    """What the learner's own gather reads back for each sequence, on the CPU; None where it
    raises or reads no (L, n_kv_heads, head_dim) pair."""
    own = {}
    for s in seq_ids:
        try:
            got = cache.gather(s)
        except LearnerRaised:
            return None
        if not (type(got) is tuple and len(got) == 2 and all(type(t) is torch.Tensor for t in got)
                and got[0].dim() == 3 and got[0].shape == got[1].shape and got[0].shape[0] >= 1):
            return None
        own[s] = tuple(t.cpu() for t in got)
    return own


def attention_judge(kata, device, case):
    """The judge of "attend" ops. The property is attention through the tables: the output must
    equal SDPA over what the learner's own gather reads back (a mistake in the cache is charged
    where the cache is judged), or else SDPA over the tokens appended and the reference."""
    def attend(cache, got, op, seqs, reference, call, diagnose):
        q, seq_ids = op[1], list(op[2])
        expect.form(got, torch.Tensor, tuple(q.shape), dtype=q.dtype, device=device, call=call, case=case,
                    what="the output")
        got = got.cpu()
        tol, inside = kata.tolerance(q.dtype), expect.float32_inside(kata, q.dtype)
        own = own_gathers(cache, seq_ids)
        if own is not None and expect.mismatch(got, sdpa(q, own, seq_ids).to(q.dtype), **(inside or tol)) is None:
            return
        truth = sdpa(q, {s: seqs.tokens(s) for s in seq_ids}, seq_ids).to(q.dtype)
        for expected, against in ((truth, SDPA), (reference, "the reference")):
            expect.array(got, expected, call=call, case=case, what="the output", diagnose=diagnose, against=against,
                         **tol, float32_inside=inside)
    return attend


def test_allocator_counts_references(learner, bugs):
    """BlockAllocator: allocate() hands out distinct blocks until none is free (then RuntimeError), incref and free count references, a block is free again only at 0, num_free() counts"""
    allocator, held, trace = learner.BlockAllocator(4, 2), {}, []
    diagnose = lambda: bugs.match(trace, lambda impl: allocator_trace(impl.BlockAllocator, ALLOCATOR_OPS)[:len(trace)],
                                  rtol=0, atol=0)
    want = allocator_trace(bugs.reference.BlockAllocator, ALLOCATOR_OPS)
    case = "allocator = BlockAllocator(4, 2); a0..a3 the ids of its first four allocate() calls"
    for i, op in enumerate(ALLOCATOR_OPS):
        done = ", ".join(f"{o[1]} = allocate()" if o[0] == "allocate" else f"{o[0]}({o[1]})"
                         for o in ALLOCATOR_OPS[:i] if o[0] in ("allocate", "incref", "free")) or "nothing"
        kind = op[0]
        call = allocator_call(op) + f"   (after {done})"
        try:
            if kind == "allocate":
                held[op[1]] = allocator.allocate()
                got = None
            elif kind == "full":
                try:
                    allocator.allocate()
                    got = "allocated"
                except LearnerRaised as exc:
                    if exc.type_name != "RuntimeError":
                        raise
                    got = "RuntimeError"
            elif kind in ("incref", "free"):
                getattr(allocator, kind)(held[op[1]])
                got = None
            else:
                got = allocator_step(allocator, held, op)
        except LearnerRaised as exc:
            if exc.type_name is None:
                raise
            trace.append("raised")
            exc.call, exc.case = exc.call or call, exc.case or case
            exc.diagnosis = exc.diagnosis or diagnose()
            raise
        trace.append(got)
        if kind == "distinct":
            ids = [held[f"a{j}"] for j in range(4)]
            expect.that(got == 1, "allocate() must hand out a different block of the pool each time, an int in "
                        "range(num_blocks), until none is free.", call=call, case=case, got=repr(ids),
                        expected="four distinct ints of range(4)", diagnose=diagnose)
        elif got != want[i] or type(got) is not type(want[i]):
            message = {"num_free": "num_free() must count the blocks allocate() can still hand out.",
                       "full": "allocate() must raise RuntimeError when no block is free.",
                       "refcount": "refcount(b) must count the references: 1 from allocate(), one more per "
                                   "incref(b), one fewer per free(b), 0 when free.",
                       "same": "The block freed by its last reference is the only free one: the next "
                               "allocate() must hand it out."}[kind]
            expect.fail(message, call=call, case=case, got=repr(got), expected=repr(want[i]), diagnose=diagnose)


def test_rejects_bad_arguments(learner):
    """a pool of no blocks or blocks of no tokens, and a fork into a sequence that exists, raise ValueError (or AssertionError)"""
    learner.BlockAllocator(1, 1)   # valid calls first: only the bad ones may raise
    cache = learner.PagedKVCache(4, 2, 1, 2, torch.float64)
    cache.append(0, torch.zeros(3, 1, 2, dtype=torch.float64), torch.zeros(3, 1, 2, dtype=torch.float64))
    cache.append(1, torch.zeros(1, 1, 2, dtype=torch.float64), torch.zeros(1, 1, 2, dtype=torch.float64))
    for call, make, why in (
            ("BlockAllocator(0, 4)", lambda: learner.BlockAllocator(0, 4), "a pool of no blocks can hold nothing"),
            ("BlockAllocator(4, 0)", lambda: learner.BlockAllocator(4, 0), "a block of 0 tokens holds nothing"),
            ("PagedKVCache(0, 4, 2, 3)", lambda: learner.PagedKVCache(0, 4, 2, 3), "a pool of no blocks"),
            ("PagedKVCache(4, 0, 2, 3)", lambda: learner.PagedKVCache(4, 0, 2, 3), "blocks of 0 tokens"),
            ("cache.fork(0, 1)", lambda: cache.fork(0, 1),
             "sequence 1 exists (1 token): a fork into it would lose its blocks")):
        expect.refused(make, call=call, case=why,
                       expected="ValueError (or AssertionError): check num_blocks >= 1, block_size >= 1 and that "
                                "dst is a new seq_id first",
                       raised="The call is invalid, but the error raised is not the expected one.",
                       returned="The call is invalid, yet it returned.")


def dims(case_rng):
    """(n_kv_heads, head_dim): different, so that an axis mix-up changes the shape."""
    return int(case_rng.integers(2, 4)), int(case_rng.integers(4, 7))


def test_append_then_gather(learner, bugs, kata, case_rng, rng, device):
    """appends of 1 to several tokens to one sequence: gather reads back exactly what was appended, in order, as the last block fills, spills and fills up"""
    for dtype, chunks in (("float64", (3, 1, 4, 2, 5, 1)), ("float32", (4, 4, 1, 6))):
        Hkv, hd = dims(case_rng)
        config = (8, 4, Hkv, hd, dtype)
        ops = []
        for op in appends(rng, [(0, t) for t in chunks], Hkv, hd, getattr(torch, dtype)):
            ops += [op, ("gather", 0)]
        case = config_text(config) + f"; one sequence, seq_id 0, appends of {', '.join(map(str, chunks))} tokens"
        drive(learner, bugs, kata, device, config, ops, case)


# Ragged turns of three sequences: lengths reach multiples of the block size (4) and pass them by
# different amounts, and no sequence's blocks lie next to each other in the order they were handed out.
TURNS = ((0, 3), (1, 5), (2, 1), (0, 2), (2, 4), (1, 3), (0, 1), (2, 3), (1, 1), (0, 6), (2, 1), (1, 4))


def test_blocks_held_are_ceil(learner, bugs, kata, case_rng, rng, device):
    """after every append each sequence holds ceil(len / block_size) blocks, seq_len counts its tokens, and num_free() is the pool less the blocks held"""
    Hkv, hd = dims(case_rng)
    config = (16, 4, Hkv, hd, "float64")
    ops = []
    for op in appends(rng, TURNS, Hkv, hd):
        ops += [op, ("len", op[1]), ("blocks", op[1]), ("num_free",)]
    case = config_text(config) + "; three sequences (seq_ids 0, 1, 2) appended in turns, ragged lengths"
    drive(learner, bugs, kata, device, config, ops, case)


def test_ragged_sequences_interleaved(learner, bugs, kata, case_rng, rng, device):
    """three sequences of ragged lengths appended in turns: each reads back its own tokens, exactly"""
    for dtype in ("float64", "float32"):
        Hkv, hd = dims(case_rng)
        config = (16, 4, Hkv, hd, dtype)
        ops = []
        for op in appends(rng, TURNS, Hkv, hd, getattr(torch, dtype)):
            ops += [op, ("gather", op[1])]
        ops += [("gather", 0), ("gather", 1), ("gather", 2)]
        case = config_text(config) + "; three sequences (seq_ids 0, 1, 2) appended in turns, ragged lengths"
        drive(learner, bugs, kata, device, config, ops, case)


def test_paged_attention_matches_sdpa(learner, bugs, kata, rng, device):
    """paged_attention: one decoding query per sequence against all its keys, read through its table, equals SDPA over each sequence's tokens (float64 and float32; 1, 2 and 3 query heads per KV head)"""
    for H, Hkv, hd, dtype in ((3, 3, 4, "float64"), (4, 2, 5, "float64"), (6, 2, 4, "float32")):
        config = (16, 4, Hkv, hd, dtype)
        ops = appends(rng, TURNS, Hkv, hd, getattr(torch, dtype))
        q = normal(rng, 3, H, hd).to(getattr(torch, dtype))
        ops += [("attend", q, (2, 0, 1)), ("append", 1, *tokens(rng, 1, Hkv, hd, getattr(torch, dtype))),
                ("attend", normal(rng, 2, H, hd).to(getattr(torch, dtype)), (1, 2))]
        case = (config_text(config) + f"; three sequences appended in turns, ragged lengths; q (B, {H}, {hd}) "
                f"standard normal, {dtype}, one query per sequence")
        drive(learner, bugs, kata, device, config, ops, case, attend=attention_judge(kata, device, case))


def test_free_and_reuse(learner, bugs, kata, case_rng, rng, device):
    """free(seq_id) gives back the sequence's blocks, new sequences reuse them and the others still read their own keys; a full pool raises RuntimeError and changes nothing"""
    Hkv, hd = dims(case_rng)
    config = (6, 4, Hkv, hd, "float64")
    T = lambda s, t: ("append", s, *tokens(rng, t, Hkv, hd))
    ops = [T(0, 5), T(1, 6), T(2, 3), ("num_free",), ("free", 1), ("num_free",), T(3, 8), ("num_free",),
           ("gather", 0), ("gather", 2), ("gather", 3), ("full", 4, *tokens(rng, 5, Hkv, hd)), ("num_free",),
           T(0, 3), ("full", 2, *tokens(rng, 6, Hkv, hd)), ("num_free",), ("gather", 2), ("len", 2), ("free", 0), ("num_free",),
           T(2, 2), T(4, 5), ("gather", 2), ("gather", 3), ("gather", 4), ("num_free",)]
    case = config_text(config) + ": a pool of 6 blocks, just large enough that freed blocks must be reused"
    drive(learner, bugs, kata, device, config, ops, case)


def test_fork_shares_blocks(learner, bugs, kata, case_rng, rng, device):
    """fork(src, dst) allocates no block: dst has src's blocks, each with reference count 2, reads the same tokens, and freeing either leaves the other whole"""
    Hkv, hd = dims(case_rng)
    config = (6, 4, Hkv, hd, "float64")
    T = lambda s, t: ("append", s, *tokens(rng, t, Hkv, hd))
    ops = [T(0, 6), ("num_free",), ("fork", 0, 1), ("num_free",), ("same_table", 0, 1), ("refcounts", 1),
           ("len", 1), ("gather", 1), ("free", 0), ("num_free",), ("refcounts", 1), T(2, 16), ("gather", 1),
           ("fork", 1, 3), ("free", 1), ("full", 4, *tokens(rng, 1, Hkv, hd)), ("gather", 3), ("refcounts", 3)]
    case = config_text(config) + ": a pool of 6 blocks, so that a block freed too early is handed out again"
    drive(learner, bugs, kata, device, config, ops, case)


def test_copy_on_write(learner, bugs, kata, case_rng, rng, device):
    """both sequences append after a fork: each reads its own tokens; a shared partial last block is copied once (one block), its last holder writes it in place, full blocks stay shared"""
    Hkv, hd = dims(case_rng)
    config = (12, 4, Hkv, hd, "float64")
    T = lambda s, t: ("append", s, *tokens(rng, t, Hkv, hd))
    # Values first, counts after: a cache that writes the shared block in place reads wrong tokens
    # before its count of blocks shows it, and one that frees a block too early the other way round.
    # Sequence 9 in turns with sequence 0, so that sequence 0's blocks are neither the pool's first
    # ones nor next to each other.
    ops = [T(9, 3), T(0, 4), T(9, 2), T(0, 2), ("fork", 0, 1), T(0, 1), ("gather", 0), ("gather", 1), T(1, 1), ("gather", 0), ("gather", 1),
           ("num_free",), ("refcounts", 0), ("refcounts", 1),
           T(2, 8), ("fork", 2, 3), ("fork", 2, 4), T(3, 1), T(4, 3), T(2, 2), ("gather", 2), ("gather", 3),
           ("gather", 4), ("num_free",), ("fork", 4, 5), T(5, 3), T(4, 1), ("gather", 4), ("gather", 5),
           ("num_free",)]
    case = config_text(config) + "; forks of sequences whose last block is partial (6 tokens) and full (8)"
    drive(learner, bugs, kata, device, config, ops, case)


# The memory check: a token is n_kv_heads * head_dim * 8 bytes * 2 (K and V) = 4 KiB, a
# pool of 64 blocks of 16 tokens 4 MiB, and a stream of 4 sequences that fills 58 of its blocks
# (910 tokens): what a cache holds and makes is measured by the kernel (resident pages), from
# outside the learner's code, beside which the interpreter's own few hundred kilobytes are small.
MEMORY = {"num_blocks": 64, "block_size": 16, "Hkv": 4, "hd": 64, "prefill": (200, 150, 230, 170), "steps": 40}


def test_pool_never_grows(learner, rng, device):
    """the pool is the cache's memory: one append creates at most a block's worth of memory, and a cache filled with 910 tokens holds no more than its pool (no copy of the tokens, no (B, T_max) padded buffer)"""
    m = MEMORY
    Hkv, hd, bs = m["Hkv"], m["hd"], m["block_size"]
    token = 2 * Hkv * hd * 8   # bytes of one token's key and value, float64
    pool = m["num_blocks"] * bs * token
    turns = [(s, t) for s, t in enumerate(m["prefill"])] + [(s, 1) for _ in range(m["steps"]) for s in range(4)]
    ops = appends(rng, turns, Hkv, hd)
    n = sum(t for _, t in turns)
    case = (f"cache = PagedKVCache({m['num_blocks']}, {bs}, {Hkv}, {hd}, torch.float64): a pool of {pool:,} bytes "
            f"({token:,} a token); 4 sequences prefilled with {', '.join(map(str, m['prefill']))} tokens, then "
            f"{m['steps']} rounds of one token each: {n} tokens")

    def streamed():
        cache = learner.PagedKVCache(m["num_blocks"], bs, Hkv, hd, torch.float64, device)
        for _, s, k, v in ops:
            cache.append(s, k, v)
        return cache

    # A first cache runs every code path once, so that the worker's memory grows, over a second, by
    # what the second holds, wherever it holds it (tensors, lists of the tokens appended, a global).
    cache = streamed()
    before = learner.resident_bytes()
    streamed()
    after = learner.resident_bytes()
    grown = None if None in (before, after) else after - before
    k1, v1 = tokens(rng, 1, Hkv, hd)
    call = "cache.append(2, k_next, v_next), one token to a sequence of 270"
    peak = learner.peak_bytes(cache.append, 2, k1, v1)
    # The reference creates a few index tensors; room for a block's worth of K and V (a copy on
    # write) and 64 KiB. A cache that concatenates the sequence's keys copies 270 tokens' worth, one
    # that concatenates onto the pool copies the whole pool.
    limit = bs * token + (64 << 10)
    expect.that(peak is not None and peak <= limit, "One append creates more memory than a block's worth of keys "
                "and values: the cache copies what it holds, so it grows with the sequences. Write the new tokens "
                "into the pool allocated in __init__.", call=call, case=case,
                got="no measurement" if peak is None else f"{peak:,} bytes created ({peak / token:.1f} tokens' worth)",
                expected=f"at most {limit:,} bytes (a block of {bs} tokens' keys and values, and 64 KiB)")
    # The pool (its pages as they are written), and 512 KiB for the interpreter's own allocations. A
    # cache that also keeps the tokens it was given holds 3.6 MiB more, one padded to the longest
    # sequence (B, T_max) more again.
    limit = pool + (512 << 10)
    expect.that(grown is None or grown <= limit, f"After {n} tokens, the sandbox holds more memory than the pool: "
                "a paged cache keeps keys and values only in its blocks, however many sequences and whatever their "
                "lengths.", call="resident memory of the sandbox, as the kernel counts it",
                case=case + "; the same stream once more, into a second cache",
                got=f"{grown:,} bytes more after the second stream ({grown / token:.1f} tokens' worth)",
                expected=f"at most {limit:,} bytes (the pool, and 512 KiB)")
    check_untampered(learner, call=call, case=case)


def test_banned_api(learner, kata, rng, device):
    """no library attention: the attention through the block tables is written with tensor operations"""
    Hkv, hd = 2, 4
    cache = learner.PagedKVCache(8, 4, Hkv, hd, torch.float64, device)
    for _, s, k, v in appends(rng, [(0, 5), (1, 3)], Hkv, hd):
        cache.append(s, k, v)
    learner.paged_attention(normal(rng, 2, 4, hd), cache, [0, 1])   # first call: lazy imports happen before recording
    q = normal(rng, 2, 4, hd)   # fresh: no earlier call saw it, so memoised outputs cannot skip the ops
    with learner.recording() as ops:
        for _, s, k, v in appends(rng, [(1, 1), (0, 1)], Hkv, hd):
            cache.append(s, k, v)
        learner.paged_attention(q, cache, [1, 0])
    used = banned_used(learner.source, ops, kata.banned)
    call = "paged_attention(q, cache, [1, 0])"
    expect.that(not used, "Your code uses a library attention this kata forbids.", call=call, got=", ".join(used),
                expected="only tensor operations (matmul, softmax)", diagnose=lambda: "banned-api")
    check_untampered(learner, call=call)
