"""The one exception type the GGUF reader raises for bad input."""

from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported.

    ``offset`` is the byte offset in the file where the problem was found (``None`` when it concerns the
    file as a whole) and ``expected`` says what should have been there.
    """

    def __init__(self, message: str, offset: int | None = None, expected: str | None = None) -> None:
        self.message = message
        self.offset = offset
        self.expected = expected
        text = message
        if offset is not None:
            text = f"at byte {offset} (0x{offset:x}): {text}"
        if expected:
            text = f"{text}; expected {expected}"
        super().__init__(text)
