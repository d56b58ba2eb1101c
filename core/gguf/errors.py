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


class NeedMoreBytes(GGUFError):
    """Parsing only a file's first bytes (``GGUFFile(prefix, file_size=N)``, a remote file read in ranges): the header
    goes on past them. ``needed`` is the prefix length that lets the read go on, ``None`` when unknown (fetch more).
    A read past the end of the *file* is an ordinary :class:`GGUFError`, as for a local file."""

    def __init__(self, message: str, offset: int | None = None, needed: int | None = None) -> None:
        super().__init__(message, offset, "more of the file's first bytes")
        self.needed = needed
