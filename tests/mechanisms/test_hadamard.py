"""The Sylvester-Hadamard matrix and the fast transform."""

from __future__ import annotations

import numpy as np
import pytest

from dp_governor.mechanisms.hadamard import fwht, hadamard, hadamard_entry, is_power_of_two


def test_h4_literal() -> None:
    assert hadamard(4).tolist() == [[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32, 64, 128])
def test_identities(m: int) -> None:
    h = hadamard(m)
    assert np.array_equal(h, h.T)
    assert np.array_equal(h @ h, m * np.eye(m, dtype=np.int64))
    if m >= 2:
        half = hadamard(m // 2)
        assert np.array_equal(h, np.block([[half, half], [half, -half]]))


@pytest.mark.parametrize("m", [1, 2, 8, 16, 32, 256, 1024])
def test_fast_transform_equals_the_matrix_and_is_its_own_inverse_up_to_m(m: int) -> None:
    rng = np.random.default_rng(m)
    x = rng.integers(-1000, 1000, size=(5, m))
    y = fwht(x)
    assert y.dtype == x.dtype
    assert np.array_equal(y, x @ hadamard(m))
    assert np.array_equal(fwht(y), m * x)
    xf = rng.standard_normal((3, m))
    np.testing.assert_allclose(
        np.asarray(fwht(xf), dtype=float), xf @ hadamard(m), rtol=1e-12, atol=1e-9
    )


def test_fwht_keeps_leading_axes_and_int32() -> None:
    x = np.arange(2 * 3 * 16, dtype=np.int32).reshape(2, 3, 16)
    y = fwht(x)
    assert y.shape == x.shape and y.dtype == np.int32
    assert np.array_equal(y.reshape(6, 16), x.reshape(6, 16) @ hadamard(16).astype(np.int32))


def test_entry_formula() -> None:
    a = np.arange(64)
    assert np.array_equal(hadamard_entry(a[:, None], a[None, :]), hadamard(64))


def test_rejects_non_powers_of_two() -> None:
    assert not is_power_of_two(0) and not is_power_of_two(12) and is_power_of_two(1)
    with pytest.raises(ValueError, match="power-of-2"):
        fwht(np.zeros((2, 12)))
    with pytest.raises(ValueError, match="power of 2"):
        hadamard(6)
