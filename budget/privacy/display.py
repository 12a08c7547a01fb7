"""Figures as printed: a privacy bound is rounded up, never to nearest.

An epsilon printed below its computed value would claim more privacy than the computation
gives (``0.28563`` shown as ``0.2856``), so every bound the service prints goes through
:func:`fmt_up`.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

__all__ = ["fmt_up", "round_up"]


def round_up(value: float, digits: int = 6) -> Decimal:
    """``value`` rounded up (toward +inf) to ``digits`` significant digits, exactly.

    >>> round_up(0.28563, 4), round_up(2.3246, 3), round_up(8.0, 4)
    (Decimal('0.2857'), Decimal('2.33'), Decimal('8.000'))
    """
    d = Decimal(repr(float(value)))
    if not d.is_finite() or d.is_zero():
        return d
    return d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_CEILING)


def fmt_up(value: float, digits: int = 6, *, thousands: bool = True) -> str:
    """``value`` printed with ``digits`` significant digits, rounded up (``{:,.6g}`` otherwise).

    >>> fmt_up(0.28563, 4), fmt_up(2.3246, 3), fmt_up(1234567.1), fmt_up(4.0)
    ('0.2857', '2.33', '1.23457e+06', '4')
    """
    if not math.isfinite(value):
        return f"{value:g}"
    spec = f"{',' if thousands else ''}.{digits}g"
    # a decimal of at most ``digits`` significant digits round-trips through the nearest float
    return format(float(round_up(value, digits)), spec)
