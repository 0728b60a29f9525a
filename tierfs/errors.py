"""Domain errors and the one table that turns them into errno values.

Code below ``operations.py`` raises these (or lets an ``OSError`` from the
local disk pass); ``operations.py`` calls `errno_of` once, in its handler
decorator, and answers the kernel with that number. Nothing else decides
an errno. The mapping follows gcsfuse (``internal/fs/wrappers/error_mapping.go``):
not found -> ENOENT, precondition failed (someone else changed the object)
-> ESTALE, 401/403 -> EACCES, anything unexpected -> EIO, logged with its cause.
"""

from __future__ import annotations

import errno


class TierfsError(Exception):
    """Base of every error tierfs raises on purpose."""

    errno: int = errno.EIO


class NotFound(TierfsError):
    """The object, generation or name does not exist."""

    errno = errno.ENOENT


class PreconditionFailed(TierfsError):
    """A generation precondition failed: another writer changed the object first."""

    errno = errno.ESTALE


class AccessDenied(TierfsError):
    """GCS answered 401 or 403, or credentials could not be obtained."""

    errno = errno.EACCES


class AlreadyExists(TierfsError):
    errno = errno.EEXIST


class NotEmpty(TierfsError):
    errno = errno.ENOTEMPTY


class NotADirectory(TierfsError):
    errno = errno.ENOTDIR


class IsADirectory(TierfsError):
    errno = errno.EISDIR


class TooManyObjects(TierfsError):
    """A directory rename would copy more objects than ``rename-dir-limit`` allows."""

    errno = errno.EMFILE


class Unsupported(TierfsError):
    """An operation tierfs (like gcsfuse) does not support; carries its errno."""

    def __init__(self, message: str, code: int = errno.ENOTSUP) -> None:
        super().__init__(message)
        self.errno = code


class NameTooLong(TierfsError):
    errno = errno.ENAMETOOLONG


class InvalidName(TierfsError):
    errno = errno.EINVAL


class Busy(TierfsError):
    """An open that would conflict with opens the kernel serves from the cache file
    (FUSE passthrough, see `tierfs.core.passthrough`)."""

    errno = errno.EBUSY


class ReadOnly(TierfsError):
    errno = errno.EROFS


class BackendError(TierfsError):
    """GCS failed after its retries (5xx, network): EIO, logged with the cause."""

    errno = errno.EIO


class UploadedOtherBytes(BackendError):
    """An upload made ``generation``, but of other bytes than the file held when its
    checksum was taken: the file changed while it was sent, and the server stored what it
    got (GCS refuses a body whose CRC32C is not the one declared; the emulator does not).
    That generation is the uploader's own: its next upload replaces it."""

    def __init__(self, message: str, generation: int) -> None:
        super().__init__(message)
        self.generation = generation


def root_cause(error: BaseException) -> BaseException:
    """The error that matters inside trio's exception groups: the first tierfs error, else
    the first leaf. A lookup runs its GCS requests in a nursery, so a 403 arrives wrapped."""
    if not isinstance(error, BaseExceptionGroup):
        return error
    leaves = [root_cause(e) for e in error.exceptions]
    return next((e for e in leaves if isinstance(e, TierfsError)), leaves[0])


def errno_of(error: BaseException) -> int:
    """The errno answered to the kernel for ``error``: the one table."""
    error = root_cause(error)
    if isinstance(error, TierfsError):
        return error.errno
    if isinstance(error, OSError) and error.errno:
        return error.errno  # local disk: ENOSPC, EDQUOT... pass through unchanged
    return errno.EIO
