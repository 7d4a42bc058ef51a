"""FedAMP's attention weights from the Gram form against the paper's pairwise sums.

Bits: ``attention`` forms the squared distances as ||a||^2 + ||b||^2 - 2 a.b of the
centred models, which is not the same arithmetic as summing (a - b)^2; the tests
compare within 1e-12 relative, and exactly only where the form guarantees it (the
diagonal, the symmetry read from one triangle).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mpifl.algorithms.fedamp import attention


def direct(models: torch.Tensor, alpha: float, sigma: float) -> np.ndarray:
    w = models.double()
    m = len(w)
    xi = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if i != j:
                d = float(((w[i] - w[j]) ** 2).sum())
                xi[i, j] = alpha * math.exp(-d / sigma) / sigma
        xi[i, i] = 1.0 - xi[i].sum()
    return xi


def models(m: int, p: int, spread: float, offset: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # a large common part and a small spread: the case where a Gram form cancels most
    return (offset + 0.05 * torch.randn(p, generator=g) + spread * torch.randn(m, p, generator=g)).float()


@pytest.mark.parametrize("spread, offset", [(0.01, 0.0), (0.001, 3.0), (0.2, -1.0)])
def test_attention_matches_the_pairwise_sums(spread, offset):
    w = models(10, 2000, spread, offset)
    sigma = float(((w[0].double() - w[1].double()) ** 2).sum())  # weights neither 0 nor all equal
    got, want = attention(w, 0.3, sigma), direct(w, 0.3, sigma)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    off = want[~np.eye(10, dtype=bool)]
    assert np.ptp(off) > 0.05 * off.max()  # the weights differ between pairs


def test_attention_is_symmetric_off_the_diagonal_and_rows_sum_to_one():
    xi = attention(models(9, 3000, 0.02, 0.5), 0.5, 2.0)
    off = ~np.eye(9, dtype=bool)
    assert np.array_equal(xi[off], xi.T[off])
    np.testing.assert_allclose(xi.sum(1), 1.0, rtol=0, atol=1e-14)


def test_identical_models_weigh_alpha_over_sigma():
    w = models(1, 4000, 0.0, 2.0).expand(5, -1).contiguous()  # every client at the same point (round 0)
    xi = attention(w, 0.2, 4.0)
    off = ~np.eye(5, dtype=bool)
    np.testing.assert_allclose(xi[off], 0.2 / 4.0, rtol=1e-13)
    np.testing.assert_allclose(np.diag(xi), 1.0 - 4 * 0.2 / 4.0, rtol=1e-13)
