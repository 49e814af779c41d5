"""Why a source could not be fetched, or an export written: one of :data:`atlas_contract.sources.REASONS`.

:class:`SourceError` carries the reason (condition ``SourcesReady``'s, and an export's), the URI and a message that
names what failed (the URI, the object, the endpoint), never a credential: every credential value of the
environment is blanked out of the message.
"""

from __future__ import annotations

import os
from typing import Any

from atlas_contract.sources import ACCESS_DENIED, NOT_FOUND, REASONS, UNREACHABLE

#: The environment variables whose values are credentials: blanked out of every message.
CREDENTIAL_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "HF_TOKEN")
#: S3 error codes by reason (the codes AWS and S3-compatible stores answer; a HEAD answers its status alone).
ACCESS_DENIED_CODES = frozenset(
    {
        "403",
        "401",
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AccountProblem",
        "InvalidSecurity",
    }
)
NOT_FOUND_CODES = frozenset({"404", "NoSuchBucket", "NoSuchKey", "NotFound", "NoSuchUpload"})
#: An error of the store itself, or a throttle: the store is there but does not serve (after boto3's retries).
UNAVAILABLE_CODES = frozenset(
    {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"}
)


class SourceError(Exception):
    """A source (or an export's destination) that failed for ``reason`` (AccessDenied, NotFound, Unreachable)."""

    def __init__(self, reason: str, uri: str, message: str):
        if reason not in REASONS:
            raise ValueError(f"reason: expected one of {', '.join(REASONS)}, got {reason!r}")
        message = redact(" ".join(str(message).split()))
        super().__init__(message)
        self.reason, self.uri, self.message = reason, uri, message

    def to_dict(self) -> dict[str, str]:
        """``{"reason", "uri", "message"}``: the initializer's termination message, an export's error."""
        return {"reason": self.reason, "uri": self.uri, "message": self.message}


def redact(text: str) -> str:
    """``text`` with every credential value of the environment replaced by ``***``."""
    for name in CREDENTIAL_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _code_of(exc: Any) -> tuple[str, int | None, str]:
    """(code, HTTP status, message) of a botocore ClientError."""
    response = getattr(exc, "response", None) or {}
    error = response.get("Error") or {}
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return str(error.get("Code") or status or ""), status, str(error.get("Message") or "")


def s3_reason(exc: BaseException) -> str | None:
    """The reason of a botocore error (a ClientError's code or status, a connection error); None when unknown."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(exc, NoCredentialsError):  # nothing to sign with: no Secret, no workload identity
        return ACCESS_DENIED
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, ConnectionClosedError, ReadTimeoutError)):
        return UNREACHABLE
    if isinstance(exc, ClientError):
        code, status, _ = _code_of(exc)
        if code in ACCESS_DENIED_CODES or status in (401, 403):
            return ACCESS_DENIED
        if code in NOT_FOUND_CODES or status == 404:
            return NOT_FOUND
        if code in UNAVAILABLE_CODES or (status is not None and status >= 500):
            return UNREACHABLE
    return None


def from_s3(exc: BaseException, uri: str, endpoint: str, what: str) -> SourceError | None:
    """A SourceError for a botocore error met on ``what`` (``s3://bucket/key``, the object or the prefix), or None
    when the error is none of the reasons (a bug: let it be seen)."""
    cause = _botocore_cause(exc)
    reason = s3_reason(cause)
    if reason is None:
        return None
    if reason == UNREACHABLE and not hasattr(cause, "response"):
        return SourceError(reason, uri, f"{what}: the S3 endpoint {endpoint} does not answer ({_short(cause)})")
    if reason == ACCESS_DENIED and not hasattr(cause, "response"):
        hint = "set spec.storage.secretRef to a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        return SourceError(reason, uri, f"{what}: no S3 credentials to sign the request with ({hint})")
    code, status, message = _code_of(cause)
    detail = f"{code}{f' (HTTP {status})' if status and str(status) != code else ''}"
    if message:
        detail += f": {message}"
    if reason == ACCESS_DENIED:
        hint = "check the credentials (spec.storage's secret: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the policy"
        return SourceError(reason, uri, f"{what}: access denied by {endpoint} ({detail}); {hint}")
    if reason == NOT_FOUND:
        return SourceError(reason, uri, f"{what}: not found at {endpoint} ({detail})")
    return SourceError(reason, uri, f"{what}: the S3 endpoint {endpoint} does not serve it ({detail})")


def _botocore_cause(exc: BaseException) -> BaseException:
    """The botocore error behind ``exc`` (boto3's transfer errors wrap the ClientError)."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if s3_reason(seen) is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def hub_reason(exc: BaseException) -> str | None:
    """The reason of a huggingface_hub error (or of what it wraps); None when unknown."""
    import httpx2
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, GatedRepoError):
            return ACCESS_DENIED
        if isinstance(seen, (RepositoryNotFoundError, RevisionNotFoundError)):
            return NOT_FOUND
        if isinstance(seen, (httpx2.ConnectError, httpx2.TimeoutException, OfflineModeIsEnabled, ConnectionError)):
            return UNREACHABLE
        if isinstance(seen, HfHubHTTPError):
            status = getattr(getattr(seen, "response", None), "status_code", None)
            if status in (401, 403):
                return ACCESS_DENIED
            if status == 404 or isinstance(seen, EntryNotFoundError):
                return NOT_FOUND
            if status is None or status >= 500 or status == 429:
                return UNREACHABLE
        if isinstance(seen, EntryNotFoundError) and not isinstance(seen, LocalEntryNotFoundError):
            return NOT_FOUND
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, LocalEntryNotFoundError):  # no answer from the hub, and no copy here
        return UNREACHABLE
    return None


def from_hub(exc: BaseException, uri: str, endpoint: str) -> SourceError | None:
    """A SourceError for a huggingface_hub error, or None when the error is none of the reasons."""
    reason = hub_reason(exc)
    if reason is None:
        return None
    detail = _short(exc)
    if reason == ACCESS_DENIED:
        hint = "a gated or private repository: spec.storage.hub.secretRef's HF_TOKEN must be a token that may read it"
        return SourceError(reason, uri, f"{uri}: access denied by {endpoint} ({detail}); {hint}")
    if reason == NOT_FOUND:
        return SourceError(reason, uri, f"{uri}: not found at {endpoint} ({detail})")
    return SourceError(reason, uri, f"{uri}: the hub {endpoint} does not answer ({detail})")


def _short(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
