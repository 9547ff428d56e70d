"""Weights are injected, the way cs336's adapters do it: a check never relies on matching the
learner's random initialisation. It draws a state dict from the seed, checks that the learner's
module holds parameters of those shapes, and loads it.
"""
from __future__ import annotations

from . import expect


def normal(rng, *shape, std=1.0):
    """float64 N(0, std²) draws of ``shape`` from the NumPy generator ``rng``: the seed replays them."""
    import torch   # here: a NumPy kata's plot or check never pays for it

    return torch.from_numpy(rng.standard_normal(shape) * std)


def listing(params) -> str:
    """{name: shape} as a check's message writes it."""
    return ", ".join(f"{name} {tuple(shape)}" for name, shape in params.items()) or "no parameters"


def inject(learner, m, sd, *, device, call, problem, hint="", exact=False, diagnose=None):
    """The learner's module ``m`` with the state dict ``sd`` loaded: its parameters checked first
    (loading into a wrong-sized projection would fail with load_state_dict's error alone), then
    cast to the weights' dtype, moved to ``device`` and put in eval mode.

    ``exact``: the module may hold no other parameter (else another one is the business of a
    parameter-count check). ``problem`` and ``hint`` are the message when the shapes differ: the
    sentence, and what follows the expected listing. ``diagnose`` names the bug from the module's
    parameters ({name: shape}), or None."""
    params = {name: entry[0] for name, entry in learner.module_info(m)["parameters"].items()}
    want = {name: list(w.shape) for name, w in sd.items()}
    if exact:
        fits, got = params == want, listing(params)
    else:
        wrong = {name: params.get(name) for name, shape in want.items() if params.get(name) != shape}
        fits, got = not wrong, ", ".join(f"{name}: {'missing' if shape is None else tuple(shape)}"
                                         for name, shape in wrong.items())
    expect.that(fits, problem, call=call, got=got, expected=listing(want) + hint,
                diagnose=diagnose and (lambda: diagnose(params)))
    m.to(device=device, dtype=next(iter(sd.values())).dtype)
    m.load_state_dict(sd, strict=False)   # buffers (a mask, a cos/sin table) are the module's own business
    m.eval()
    return m
