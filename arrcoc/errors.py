"""One error hierarchy. Every message tells the user what went wrong and what to do."""

from __future__ import annotations


class ArrcocError(Exception):
    """Base of every error the library raises on purpose."""


class InvalidInputError(ArrcocError, ValueError):
    """The caller gave something we cannot use (wrong type, empty query, bad option)."""


class ImageError(InvalidInputError):
    """An image could not be read: corrupt, unsupported, too large or too small."""


class WeightsError(ArrcocError):
    """Weights are missing, corrupt, or belong to another model version."""


class UnknownVariantError(InvalidInputError, KeyError):
    """No model variant is registered under that name."""

    def __str__(self) -> str:  # KeyError quotes its message; we want plain text
        return str(self.args[0]) if self.args else "unknown variant"


class EngineError(ArrcocError):
    """A backend could not be built or asked to do something it was not prepared for."""


class JobError(ArrcocError):
    """A job is unknown, expired, cancelled or failed."""


class JobCancelled(JobError):
    """The job was cancelled (or ran past its time limit) while it ran: its work stops here."""


class AccessDenied(ArrcocError):
    """The request lacks the API token this server requires, or sent too many requests."""


class ServiceUnavailableError(ArrcocError):
    """The queue (Redis), its workers or the engine did not answer in time: check that they run, then retry."""


class DeadlineExceeded(ArrcocError, TimeoutError):
    """A request waited past its deadline before the engine got to it."""
