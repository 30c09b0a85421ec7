"""Numbers as Accelerate accepts them: numpy and other integer types, and whole floats.

Accelerate stores counts (accumulation steps, mesh sizes, ...) as given and only does
arithmetic with them, so ``np.int64(2)`` and ``2.0`` work there. hasten checks counts up front;
these helpers let the same values through, as plain ints.
"""

from __future__ import annotations

import numbers

__all__ = ["whole_number"]


def whole_number(value: object) -> int | None:
    """Return ``value`` as an int if it is a whole number of any numeric type, else None.

    ``np.int64(2)``, ``2`` and ``2.0`` give 2; ``2.5``, ``"2"``, ``None`` and bools give None
    (a bool is a flag, not a count).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return int(number) if number.is_integer() else None
    return None
