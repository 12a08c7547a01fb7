"""Analytic moments of the CMS and HCMS estimators (Apple, *Learning with Privacy at Scale*).

``n`` reports, true count ``f = f(d)`` of the queried item, ``f2_others = sum over d* != d of
f(d*)**2``. The *exact* variances are the last displays of Appendices A (CMS) and B (HCMS), which
average over the client coins and a uniformly random hash family; Theorems 4.2 and 4.4 are only
upper bounds. For one fixed, deployed family the estimator is biased by collisions; the
``fixed_family_*`` functions give the conditional mean and variance
(docs/mechanisms.md, "Count Mean Sketch").
All functions are vectorised over ``f``.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = [
    "cms_c",
    "cms_variance_bound",
    "cms_variance_exact",
    "fixed_family_mean",
    "fixed_family_variance",
    "hcms_c",
    "hcms_variance_bound",
    "hcms_variance_exact",
]

FloatArray = npt.NDArray[np.float64]


def cms_c(epsilon: float) -> float:
    """CMS debiasing constant ``c = (e^(eps/2) + 1) / (e^(eps/2) - 1) = coth(eps/4)``.

    >>> round(cms_c(4.0), 10)
    1.3130352855
    """
    return 1.0 / math.tanh(epsilon / 4.0)


def hcms_c(epsilon: float) -> float:
    """HCMS debiasing constant ``c = (e^eps + 1) / (e^eps - 1) = coth(eps/2)``.

    >>> round(hcms_c(4.0), 10)
    1.0373147207
    """
    return 1.0 / math.tanh(epsilon / 2.0)


def _scale(m: int) -> float:
    return (m / (m - 1)) ** 2


def cms_variance_exact(
    epsilon: float, k: int, m: int, n: float, f: npt.ArrayLike, f2_others: npt.ArrayLike
) -> FloatArray:
    """Exact ``Var[f~(d)]`` of CMS over coins and a random family (Appendix A).

    ``(m/(m-1))^2 [n (c^2-1)/4 + ((n-f)/m)(1 - 1/m - 1/k + 1/(km)) + (1/(km) - 1/(km^2)) F2o]``.
    """
    c = cms_c(epsilon)
    f_ = np.asarray(f, dtype=np.float64)
    f2o = np.asarray(f2_others, dtype=np.float64)
    inner = (
        n * (c * c - 1.0) / 4.0
        + ((n - f_) / m) * (1.0 - 1.0 / m - 1.0 / k + 1.0 / (k * m))
        + (1.0 / (k * m) - 1.0 / (k * m * m)) * f2o
    )
    out: FloatArray = _scale(m) * inner
    return out


def hcms_variance_exact(
    epsilon: float, k: int, m: int, n: float, f: npt.ArrayLike, f2_others: npt.ArrayLike
) -> FloatArray:
    """Exact ``Var[f~(d)]`` of HCMS over coins and a random family (Appendix B).

    ``(m/(m-1))^2 [n c^2 - f - (n-f)/m^2 + (1/k)(1/m - 1/m^2)(F2o - (n-f))]``.
    """
    c = hcms_c(epsilon)
    f_ = np.asarray(f, dtype=np.float64)
    f2o = np.asarray(f2_others, dtype=np.float64)
    inner = (
        n * c * c
        - f_
        - (n - f_) / (m * m)
        + (1.0 / k) * (1.0 / m - 1.0 / (m * m)) * (f2o - (n - f_))
    )
    out: FloatArray = _scale(m) * inner
    return out


def cms_variance_bound(epsilon: float, k: int, m: int, n: float, f2: float) -> float:
    """Theorem 4.2's upper bound, ``f2`` the sum of all squared counts.

    ``(m/(m-1))^2 (e^(eps/2)/(e^(eps/2)-1)^2 + 1/m + F2/(nkm)) n``.
    """
    e = math.exp(epsilon / 2.0)
    return _scale(m) * (e / (e - 1.0) ** 2 + 1.0 / m + f2 / (n * k * m)) * n


def hcms_variance_bound(epsilon: float, k: int, m: int, n: float, f2: float) -> float:
    """Theorem 4.4's upper bound: ``(m/(m-1))^2 (c^2 + F2/(nkm)) n`` (it has no ``1/m`` term)."""
    c = hcms_c(epsilon)
    return _scale(m) * (c * c + f2 / (n * k * m)) * n


def _collision_fractions(hash_matrix: npt.ArrayLike) -> FloatArray:
    """``C[d', d] = |{j : h_j(d') = h_j(d)}| / k`` for a ``(k, d)`` table of hash values."""
    h = np.asarray(hash_matrix)
    k = h.shape[0]
    eq = (h[:, :, None] == h[:, None, :]).sum(axis=0)
    out: FloatArray = eq.astype(np.float64) / k
    return out


def fixed_family_mean(f: npt.ArrayLike, hash_matrix: npt.ArrayLike, m: int) -> FloatArray:
    """``E[f~(d) | H] = f(d) + (m/(m-1)) sum_{d' != d} f(d') (C_H(d', d) - 1/m)`` for CMS and HCMS.

    ``hash_matrix`` is the ``(k, d)`` table ``h_j(item)`` over the whole population's items.
    """
    f_ = np.asarray(f, dtype=np.float64)
    coll = _collision_fractions(hash_matrix)
    np.fill_diagonal(coll, 1.0 / m)  # the d' = d term is excluded
    out: FloatArray = f_ + (m / (m - 1)) * (f_ @ (coll - 1.0 / m))
    return out


def fixed_family_variance(
    mechanism: str, epsilon: float, f: npt.ArrayLike, hash_matrix: npt.ArrayLike, m: int
) -> FloatArray:
    """``Var[f~(d) | H]`` over the client coins for one fixed family.

    CMS: ``(m/(m-1))^2 sum_i [(c^2-1)/4 + C_i (1 - C_i)]``;
    HCMS: ``(m/(m-1))^2 sum_i (c^2 - C_i^2)``; with ``C_i = C_H(d(i), d)`` (1 when ``d(i) = d``).
    """
    f_ = np.asarray(f, dtype=np.float64)
    coll = _collision_fractions(hash_matrix)
    np.fill_diagonal(coll, 1.0)
    if mechanism == "cms":
        c = cms_c(epsilon)
        per_report = (c * c - 1.0) / 4.0 + coll * (1.0 - coll)
    elif mechanism == "hcms":
        c = hcms_c(epsilon)
        per_report = c * c - coll * coll
    else:
        raise ValueError(f"`mechanism` must be 'cms' or 'hcms', got {mechanism!r}")
    out: FloatArray = _scale(m) * (f_ @ per_report)
    return out
