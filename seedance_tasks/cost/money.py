"""Exact money: Decimal amounts, the Arrow type they travel in, largest-remainder splits, and the one
rule for an amount a person reads (`rounded`, `display`): half-up, away from zero, to the currency's
minor unit."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal, localcontext
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from babel.numbers import get_currency_precision

SCALE = 12
"""Decimal places kept for every amount (FOCUS exports carry up to 10-11)."""
MONEY = pa.decimal128(38, SCALE)
QUANTUM = Decimal(1).scaleb(-SCALE)
ZERO = Decimal(0)
MAX_DIGITS = 18
"""Digits before the point of one line's amount: |amount| < 10**18. Arrow sums a batch in MONEY
(38 digits, 26 before the point) and wraps around silently past it; this bound keeps any batch
of up to 10**8 lines exact."""
LIMIT = Decimal(10) ** MAX_DIGITS
CONTEXT = Context(prec=100, Emax=10**6, Emin=-(10**6))
"""Decimal arithmetic on amounts: wide enough that sums of MONEY values never round (Python's
default context keeps 28 digits, which rounds a 12-place sum past 10**16)."""
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
F = TypeVar("F", bound=Callable[..., Any])


def exact(func: F) -> F:
    """Run `func` under CONTEXT (thread-local; restored afterwards)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with localcontext(CONTEXT):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def unscaled(values: pa.Array) -> tuple[np.ndarray, int, int] | None:
    """The unscaled integers (amount * 10**scale) of a decimal128 array as an int64 view of its
    buffer, with their least and greatest; None where one needs more than 64 bits (or the array is
    not decimal128 at offset 0, or is empty). Null slots may hold any bits: they only make this
    decline."""
    if not pa.types.is_decimal128(values.type) or values.offset or len(values) == 0:
        return None
    words = np.frombuffer(values.buffers()[1], np.int64, count=2 * len(values))
    low = words[0::2]
    if not np.array_equal(words[1::2], low >> 63):  # the high word is only the sign's extension
        return None
    return low, int(low.min()), int(low.max())


def decimals_as_money(values: pa.Array) -> pa.Array | None:
    """decimal128 `values` of at most SCALE places as MONEY, exactly, or None where this fast path
    does not apply (the caller then casts with Arrow, which checks every value).

    Applies when every unscaled value, rescaled to SCALE places, fits an int64 (|amount| below
    9.2e18 / 10**SCALE): then the rescale is one integer multiply per value, and every amount is
    within LIMIT.
    """
    if not pa.types.is_decimal128(values.type) or values.type.scale > SCALE:
        return None
    found = unscaled(values)
    if found is None:
        return None
    words, least, greatest = found
    factor = 10 ** (SCALE - values.type.scale)
    bound = np.iinfo(np.int64).max // factor
    if least < -bound or greatest > bound:
        return None
    out = np.empty((len(values), 2), np.int64)
    np.multiply(words, factor, out=out[:, 0])  # null slots: any bits, multiplied (they stay null)
    np.right_shift(out[:, 0], 63, out=out[:, 1])
    return pa.Array.from_buffers(MONEY, len(values), [values.buffers()[0], pa.py_buffer(out)],
                                 null_count=values.null_count)


def exact_sums(keys: np.ndarray, size: int, values: pa.Array, wanted: np.ndarray) -> list[Decimal] | None:
    """The exact sums of decimal128 `values` per key (keys in [0, size)), for the `wanted` keys, as
    Decimals; None where this fast path does not apply: a null, a value past an int64, or a sum
    that could pass one."""
    if values.null_count:
        return None
    found = unscaled(values)
    if found is None:
        return None
    words, least, greatest = found
    if max(-least, greatest) * len(values) > np.iinfo(np.int64).max:
        return None
    sums = np.zeros(size, np.int64)
    np.add.at(sums, keys, words)
    scale = values.type.scale
    return [Decimal(total).scaleb(-scale, context=CONTEXT) for total in sums[wanted].tolist()]


def _places(value: Decimal) -> int:
    """Decimal places `value` really has (trailing zeros do not count), without any rounding."""
    _, digits, exponent = value.as_tuple()
    stripped = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    return 0 if stripped == len(digits) else max(0, -(exponent + stripped))


def _checked(value: Decimal, text: str) -> Decimal:
    """`value` if MONEY holds it exactly (at most SCALE places, |value| < LIMIT); else ValueError."""
    if _places(value) > SCALE:
        raise ValueError(f"more than {SCALE} decimal places: {text!r}")
    if value and value.adjusted() >= MAX_DIGITS:
        raise ValueError(f"out of range: {text!r} (an amount is below 1e{MAX_DIGITS})")
    if value.as_tuple().exponent < -SCALE:  # trailing zeros only: 1.0000000000000 -> 1.000000000000
        value = value.quantize(QUANTUM, context=CONTEXT)
    return value


def parse_amount(text: str) -> Decimal:
    """`text` as an exact Decimal with at most SCALE places; ValueError saying why if not.

    Accepts plain decimals with an optional sign and exponent (`-1.5`, `.5`, `2e-3`) around
    whitespace, exactly what Arrow's decimal cast accepts and a little more; never rounds.
    """
    body = text.strip() if isinstance(text, str) else None
    if body is None or not _NUMBER.fullmatch(body):
        if body and body.lstrip("+-").lower() in ("nan", "inf", "infinity", "snan"):
            raise ValueError(f"not a finite number: {text!r}")
        raise ValueError(f"not a number: {text!r}")
    return _checked(Decimal(body), text)


def amount_to_scale(text: str) -> tuple[Decimal, bool]:
    """`text` as `parse_amount` reads it, except that an amount with more than SCALE decimal places
    is rounded half-even to SCALE places instead of refused (exports computed in binary floating
    point print 16-24 of them, e.g. Azure's: what lies past the 12th is noise, as `float_amount`
    drops it); and whether it was rounded. ValueError saying why for text that is no such amount."""
    try:
        return parse_amount(text), False
    except ValueError:
        body = text.strip() if isinstance(text, str) else None
        if body is None or not _NUMBER.fullmatch(body) or _places(Decimal(body)) <= SCALE:
            raise
    amount = Decimal(body).quantize(QUANTUM, rounding=ROUND_HALF_EVEN, context=CONTEXT)
    return _checked(amount, text), True


def float_amount(value: float) -> Decimal:
    """A binary float as the Decimal it stands for: its shortest repr (`0.1` -> `0.1`, never
    `0.1000000000000000055...`), rounded half-even to SCALE places only where that repr has more
    (what is left there is binary noise). ValueError for NaN, infinities and out-of-range values."""
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    amount = Decimal(repr(value))
    if _places(amount) > SCALE:
        amount = amount.quantize(QUANTUM, rounding=ROUND_HALF_EVEN, context=CONTEXT)
    return _checked(amount, repr(value))


def fmt(value: Decimal) -> str:
    """A canonical decimal string: no exponent, no trailing zeros past the point (`12.5`, `0`, `-3`)."""
    if value == 0:
        return "0"
    return format(value.normalize(CONTEXT), "f")


@functools.lru_cache(maxsize=512)
def minor_units(currency: str | None) -> int:
    """Decimal places an amount in `currency` is shown and deducted with: the currency's minor unit as
    babel (CLDR) gives it (USD 2, JPY 0, KWD 3); 2 for None, an empty code or a code babel does not know."""
    return get_currency_precision(currency.strip().upper()) if currency and currency.strip() else 2


def rounded(amount: Decimal | int | str, currency: str | None) -> Decimal:
    """`amount` rounded half-up (ties away from zero, so -3.005 -> -3.01) to `currency`'s minor unit,
    with exactly that many places; a result of zero is never negative."""
    value = Decimal(amount).quantize(Decimal(1).scaleb(-minor_units(currency)), rounding=ROUND_HALF_UP,
                                     context=CONTEXT)
    return value if value else abs(value)


def display(amount: Decimal | int | str, currency: str | None = None) -> str:
    """`amount` as a person reads it: `rounded`, thousands separators, a leading minus when negative,
    then the currency code (`-1,234.57 USD`, `1,235 JPY`, `1.235 KWD`); None or an empty currency shows
    the number alone, at 2 places (`1,234.57`)."""
    value = rounded(amount, currency)
    text = f"{value:,.{minor_units(currency)}f}"
    return f"{text} {currency}" if currency else text


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
