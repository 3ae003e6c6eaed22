"""Key and gate rows of written cells, and the pooling formula (ENGINE.md §8).

Owns: the key generator (a counter-based integer hash of the trace seed, the
cache's per-write key id and the dimension) and the constants both backends share
(`POW2`, `GATE_MAX`). This is the numpy spelling; `kernels.py` has the numba twin
of `key_rows_from_state` and the tests hold the two equal bit for bit.

Why integers and powers of two. The numba and numpy backends must agree to the
last bit on every trace, and two compilers only agree on float results when every
operation is a single correctly rounded IEEE operation, done in the same order:
- no transcendental functions (`exp`, `log`, `pow` differ between libm, SVML and
  numpy's own loops): a key is `(h >> 40) - 2**23` scaled by `2**-23`, exact in
  float32 and in [-1, 1); a gate logit is a small integer in [-GATE_MAX, GATE_MAX];
- the gate softmax is base 2: `w_i = 2**(g_i - max g) / sum_j 2**(g_j - max g)`,
  where each power of two comes from the table `POW2` (exact), the sum of at most
  a few powers of two is exact, and the division is one correctly rounded float32
  division;
- the pooled value accumulates `acc = acc + w_i * k_i` over members i = 0..kpool-1
  in that order, per dimension, in float32, with no fused multiply-add (numba runs
  without fastmath, so LLVM may not contract) and no `np.sum` (whose pairwise
  summation may reorder).

Identity of keys: the cache hands out key ids 1, 2, ... one per
written cell (`KvCache.n_key_writes`), so a freed and rewritten cell gets a new key
and two cells at one pos in two sequences differ; a stream copy or a restore moves
rows (and the cache moves their key ids), so they keep the key they copy.
Key id 0 is a zeroed row: every key and gate logit 0.
"""

from __future__ import annotations

import numpy as np

GATE_MAX = 4  # gate logits are integers in [-GATE_MAX, GATE_MAX]
# POW2[i] = 2**-i, exact in float32: the softmax weight numerator for g - max g = -i
POW2 = np.array([2.0 ** -i for i in range(2 * GATE_MAX + 1)], dtype=np.float32)
KEY_SCALE = np.float32(2.0 ** -23)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
KEY_MUL = np.uint64(0xD1B54A32D192ED03)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of `x + GOLDEN` (uint64, wrapping), elementwise."""
    z = np.asarray(x, dtype=np.uint64) + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def seed_state(seed: int) -> np.uint64:
    """The per-trace hash state every key id is mixed into."""
    return np.uint64(splitmix64(np.array([seed & (2**64 - 1)], dtype=np.uint64))[0])


def key_rows_from_state(state: np.uint64, key_ids: np.ndarray, n_embd: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Key and gate rows of the writes `key_ids`.

    Parameters
    ----------
    state : np.uint64
        `seed_state(seed)` of the trace's `seed`.
    key_ids : array of int64, shape (n,)
        The cache's per-write key ids; 0 is a zeroed row.
    n_embd : int
        Key width.

    Returns
    -------
    key : array of float32, shape (n, n_embd)
        In [-1, 1) (multiples of 2**-23).
    gate : array of int8, shape (n, n_embd)
        Integer logits in [-GATE_MAX, GATE_MAX]. For key id 0 both rows are 0.

    Dimension d of key id i: `base = splitmix64(state ^ i * KEY_MUL)`, key hash
    `splitmix64(base + (2d+1) GOLDEN)`, gate hash `splitmix64(base + (2d+2) GOLDEN)`.
    """
    ids = np.asarray(key_ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        base = splitmix64(np.uint64(state) ^ (ids * KEY_MUL))
        d = np.arange(n_embd, dtype=np.uint64)
        hk = splitmix64(base[:, None] + (np.uint64(2) * d + np.uint64(1)) * GOLDEN)
        hg = splitmix64(base[:, None] + (np.uint64(2) * d + np.uint64(2)) * GOLDEN)
    key = ((hk >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(np.float32) * KEY_SCALE
    gate = ((hg >> np.uint64(32)) % np.uint64(2 * GATE_MAX + 1)).astype(np.int64) - GATE_MAX
    gate = gate.astype(np.int8)
    zero = ids == 0
    key[zero] = 0
    gate[zero] = 0
    return key, gate
