"""Rows the quantizer byte-identity tests feed to ggml (when recording) and to ours (when testing).

Each set is ``(rows, imatrix)``: float32 rows whose length is a multiple of 256 (every type's block) and a
positive importance vector of one row's length. The generated sets are deterministic for their seed (numpy's
PCG64 gives the same stream everywhere); the real rows come from SmolLM2-135M and are stored in the fixture.
"""

from __future__ import annotations

import numpy as np

#: the types whose quantizers must match ggml's bytes
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "TQ1_0", "TQ2_0", "MXFP4")


def _normal() -> tuple[np.ndarray, np.ndarray]:
    """Weights like a trained layer's: N(0, 0.02), with an importance spread over two orders of magnitude."""
    rng = np.random.default_rng(1801)
    rows = rng.normal(0.0, 0.02, (8, 512)).astype(np.float32)
    imat = np.exp(rng.normal(0.0, 1.2, 512)).astype(np.float32)
    return rows, imat


def _wide() -> tuple[np.ndarray, np.ndarray]:
    """Each 32-value group at its own scale (1e-4 .. 10), skewed signs, a few large outliers, some zero weights."""
    rng = np.random.default_rng(1802)
    n = 1024
    scale = np.exp(rng.uniform(np.log(1e-4), np.log(10.0), (4, n // 32))).repeat(32, axis=1)
    rows = rng.normal(0.3, 1.0, (4, n)) * scale
    idx = rng.integers(0, n, 12)
    rows[np.arange(12) % 4, idx] *= 40.0
    imat = rng.uniform(0.0, 3.0, n) ** 3
    imat[rng.integers(0, n, 40)] = 0.0
    return rows.astype(np.float32), imat.astype(np.float32)


def _edge() -> tuple[np.ndarray, np.ndarray]:
    """Rows that reach the quantizers' special cases: zeros, constants, one spike, exact grids, tiny and big."""
    n = 256
    rng = np.random.default_rng(1803)
    rows = np.zeros((12, n), np.float32)
    rows[1] = 0.5
    rows[2] = -3.0
    rows[3, 17] = 2.5
    rows[4] = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    rows[5] = (np.arange(n) % 16) - 8
    rows[6] = rng.normal(0.0, 1e-30, n)
    rows[7] = rng.normal(0.0, 1e4, n)
    rows[8, : n // 2] = rng.normal(0.0, 0.1, n // 2)
    rows[9] = np.abs(rng.normal(0.0, 0.1, n))
    rows[10] = -np.abs(rng.normal(0.0, 0.1, n))
    rows[11] = rng.integers(-1, 2, n) * 0.25
    imat = np.ones(n, np.float32)
    imat[::7] = 0.0
    imat[3::5] = 9.0
    return rows, imat


GENERATED = {"normal": _normal, "wide": _wide, "edge": _edge}


def generated_sets() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: fn() for name, fn in GENERATED.items()}
