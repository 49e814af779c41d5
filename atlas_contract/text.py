"""Reading the files users hand us (manifests, run configurations) in the encodings editors write."""

from __future__ import annotations

import codecs
import reprlib
from pathlib import Path
from typing import Any

from atlas_contract.errors import InvalidFields

# Byte-order marks, longest first (UTF-32's starts like UTF-16's).
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_text(data: bytes, name: str) -> str:
    """UTF-8, or UTF-8/16/32 with a byte-order mark (PowerShell's `>` writes UTF-16); anything else is
    refused naming the file."""
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise InvalidFields(
            [f"{name}: not {encoding.upper()} text (byte {exc.start}); save it as UTF-8 (or UTF-16 with a BOM)"]
        ) from None


def read_text(path: str | Path) -> str:
    """A text file as :func:`decode_text` reads it; InvalidFields names the file when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidFields([f"{path}: {exc.strerror or exc}"]) from None
    return decode_text(data, str(path))


def bounded_repr(value: Any) -> str:
    """A bounded repr for an error message: a value from a manifest can be huge, and a message must not be."""
    shown = reprlib.Repr()  # Python 3.11: limits are attributes, not arguments
    shown.maxstring, shown.maxlist, shown.maxdict, shown.maxother = 60, 6, 4, 60
    return shown.repr(value)
