"""Hidden references of the katas, and beside each its bug oracles (``<kata>_bugs.py``) and the
expected values its grader writes out by hand (``<kata>_expected.py``, ``bugs.expected``).

Glossary of letters, shared by every kata: B batch, T sequence length (Tq queries, Tk keys),
C or d_model channels, H query heads, Hkv key/value heads, hd head dimension (C // H),
g group size (H // Hkv), d a feature dimension.
"""
