"""Errors that reach a user as one clear message instead of a traceback.

The command line and the components catch :class:`DrasliceError` and print its message;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DrasliceError(Exception):
    """Base class: the message is complete and meant for the user.

    ``detail`` is more text behind the one line (a server's whole answer), printed under it
    only when ``show_detail`` is set (a command's ``--verbose``)."""

    exit_code = 2
    detail: str = ""
    show_detail: bool = False


class InvalidParameter(DrasliceError, ValueError):
    """A parameter is outside its valid range; raised before any work starts."""

    def __init__(self, name: str, value: object, valid: str) -> None:
        self.name = name
        self.value = value
        self.valid = valid
        super().__init__(f"invalid {name}={value!r}: {valid}")


class SliceOutOfMemory(DrasliceError):
    """The job needed more memory than the slice has."""

    exit_code = 3


class TrainingDiverged(DrasliceError):
    """The loss became NaN or infinite; training stopped."""

    exit_code = 4


class ValidationFailed(DrasliceError):
    """The validate step's verdict was FAIL."""

    exit_code = 1


class DatasetError(DrasliceError):
    """The training data cannot be used; the message names the file, line and column."""


class ModelLoadError(DrasliceError):
    """The base model or its tokenizer cannot be loaded from the given directory."""


class MissingDependency(DrasliceError):
    """An optional feature was asked for without the package or device it needs."""


class OutputWriteError(DrasliceError):
    """The output folder refused the bytes (full disk, quota, read-only); the message names
    the folder, the reason and the free space. Nothing half-written is left behind."""
