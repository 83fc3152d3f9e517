"""loadstone's errors as Python exceptions.

Every failure of the C++ runtime is a ``loadstone.Error`` whose message is the runtime's own
(file, tensor, byte offset and, where there is one, the fix). Each status code has a subclass
that also derives from the built-in exception Python code expects there, so existing
``except FileNotFoundError`` / ``except ValueError`` blocks keep working.
"""
import concurrent.futures


class Error(Exception):
    """Base of every loadstone error. ``code`` names the runtime's status code."""

    code = "Unknown"


class InvalidArgumentError(Error, ValueError):
    """An argument or option that cannot be (a bad dtype, device map or budget)."""

    code = "InvalidArgument"


class NotFoundError(Error, FileNotFoundError):
    """A file, tensor or device that does not exist."""

    code = "NotFound"


class CorruptionError(Error, ValueError):
    """A checkpoint that breaks its format's rules (truncated, lying header, hostile pickle)."""

    code = "Corruption"


class InputOutputError(Error, OSError):
    """The operating system failed a read, open or write."""

    code = "IOError"


class OutOfMemoryError(Error, MemoryError):
    """Host or device memory could not be had."""

    code = "OutOfMemory"


class UnsupportedError(Error, NotImplementedError):
    """A valid input loadstone does not handle (yet)."""

    code = "Unsupported"


class CancelledError(Error, concurrent.futures.CancelledError):
    """The load was cancelled (cancel(), Ctrl-C) before it finished."""

    code = "Cancelled"


class CallbackError(Error, RuntimeError):
    """A callback the caller gave raised; the message names it and what it raised."""

    code = "CallbackFailed"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        CorruptionError,
        InputOutputError,
        OutOfMemoryError,
        UnsupportedError,
        CancelledError,
        CallbackError,
    )
}


def class_for_code(code):
    """The exception class of a status code name ("NotFound", ...); Error for an unknown one."""
    return _BY_CODE.get(code, Error)


__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptionError",
    "InputOutputError",
    "OutOfMemoryError",
    "UnsupportedError",
    "CancelledError",
    "CallbackError",
]
