"""Exact money: Decimal amounts, the Arrow type they travel in, and largest-remainder splits."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import pyarrow as pa

SCALE = 12
"""Decimal places kept for every amount (FOCUS exports carry up to 10-11)."""
MONEY = pa.decimal128(38, SCALE)
QUANTUM = Decimal(1).scaleb(-SCALE)
ZERO = Decimal(0)


def parse_amount(text: str) -> Decimal:
    """`text` as an exact Decimal with at most SCALE places; ValueError saying why if not."""
    try:
        value = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not a finite number: {text!r}")
    if value != value.quantize(QUANTUM, rounding="ROUND_HALF_EVEN"):
        raise ValueError(f"more than {SCALE} decimal places: {text!r}")
    return value


def fmt(value: Decimal) -> str:
    """A canonical decimal string: no exponent, no trailing zeros past the point (`12.5`, `0`, `-3`)."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def largest_remainder(total: Decimal, weights: Sequence[Fraction | Decimal | int], quantum: Decimal) -> list[Decimal]:
    """Split `total` into parts proportional to `weights`, each a multiple of `quantum`, summing exactly to `total`.

    The quantum is made fine enough to express `total` itself. Each part is first rounded toward
    zero; the units left over go one each to the parts with the largest remainders (ties: the
    earlier part). Negative totals (credits) split the same way with signs mirrored. Weights must
    be non-negative with a positive sum.
    """
    exponent = min(quantum.as_tuple().exponent, total.normalize().as_tuple().exponent)
    quantum = Decimal(1).scaleb(exponent)
    fractions = [Fraction(weight) for weight in weights]
    weight_sum = sum(fractions, Fraction(0))
    if not fractions or weight_sum <= 0 or any(weight < 0 for weight in fractions):
        raise ValueError("weights must be non-negative with a positive sum")
    sign = -1 if total < 0 else 1
    units = int((abs(total) / quantum).to_integral_value())
    shares = [Fraction(units) * weight / weight_sum for weight in fractions]
    floors = [share.numerator // share.denominator for share in shares]
    left = units - sum(floors)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - floors[i]), i))
    for index in order[:left]:
        floors[index] += 1
    return [sign * Decimal(count) * quantum for count in floors]


def to_arrow(values: Sequence[Decimal | None]) -> pa.Array:
    return pa.array(values, type=MONEY)
