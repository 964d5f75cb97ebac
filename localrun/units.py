"""Byte sizes: formatting (``fmt_bytes``) and parsing of user input (``parse_bytes``), one of each.

Binary units throughout (KiB = 1024 bytes). In user input GB/G are read as GiB, as people mean them
for RAM and VRAM ("a 24 GB card" holds 24 GiB).
"""

from __future__ import annotations

import re

MIN_BARE_BYTES = 1 << 20  # a bare number below 1 MiB is surely a size in GiB/MiB with the unit left off

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*")


def fmt_bytes(n: float) -> str:
    """Human size with binary units: 1536 → '1.5 KiB', 24 << 30 → '24.0 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_bytes(text: str, *, flag: str = "size") -> int:
    """A size as a user types it → bytes.

    Accepts ``24GiB``, ``24GB``, ``24G``, ``24 GiB``, ``1.5T``, ``512MiB``, ``512M``, ``64KiB``, and a plain
    byte count of at least 1 MiB (``25769803776``). ``flag`` names the option in the error message.

    Raises SizeError (a ConfigError, exit 9, and a ValueError) with a hint for anything else, in
    particular a bare number below 1 MiB (``--vram 24`` would be 24 bytes: the hint suggests ``24GiB``;
    ``--ram 16384`` suggests ``16384MiB``).
    """
    from localrun.errors import SizeError

    m = _SIZE.fullmatch(text.upper())
    if not m:
        raise SizeError(f"{flag}: cannot read {text!r} as a size",
                          hint="give a number and a unit, e.g. 24GiB, 16GB, 512MiB")
    num, unit, suffix = float(m.group(1)), m.group(2), m.group(3)
    if not unit and not suffix and num < MIN_BARE_BYTES:
        guess = m.group(1) + ("MiB" if num >= 1024 else "GiB")  # 24 → 24GiB; 16384 → 16384MiB
        raise SizeError(f"{flag}: {text!r} has no unit, and as bytes it is too small to mean anything",
                          hint=f"did you mean {guess}? Sizes take a unit: GiB (or GB, G), MiB, TiB")
    return int(num * _UNITS[unit])
