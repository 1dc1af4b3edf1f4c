"""Error types. Each one carries a single human-readable line."""


class PrefdataError(Exception):
    """A usage or input error: the CLI prints the message on one line and exits 2."""

    exit_code = 2


class RecordError(ValueError):
    """One record cannot be read or normalized; it goes to quarantine with this one-line reason."""


class UnknownShapeError(RecordError):
    """The record is valid JSON but matches no known preference shape (e.g. KTO or SFT data)."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-line
    error quotes of a library's multi-line message."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
