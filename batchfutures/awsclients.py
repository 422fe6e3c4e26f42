"""The AWS clients of one environment: one boto3 Session, one credential source, one retry policy.

    boto3.Session ──(one lock)──> client("batch"), client("logs"), client("sts"),
         │                        client("secretsmanager"), ...   made once each, then shared
         │ get_credentials(): refreshable for SSO, assume-role, instance and task roles
         v
    the same credentials object ──> aiobotocore AioSession of s3fs (SharedCredentialProvider):
                                    S3 signs with the keys Batch and Logs use, refreshed with them

Every client has botocore's own retries off (`CLIENT_CONFIG`): the one retry budget per call is
`batchapi.call` (Batch, Logs, STS, Secrets Manager) or the storage layer (S3:
`storage.STORAGE_RETRY`, which also turns s3fs's own loop off), so budgets never multiply.
One exception, on every client: an `ExpiredToken` answer forces a refresh of the credentials
and the request is signed and sent once more (`ExpiredTokenRetry`), so temporary credentials
that expired early never become a permanent PermissionError.

On S3, every operation whose model has `ExpectedBucketOwner` gets it (`owner_hook`), from a
callable so the account can be looked up lazily (STS GetCallerIdentity, once).

Botocore sessions are not thread-safe to create clients from (the poller and the caller's
thread both ask), hence the lock; the clients themselves are thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

logger = logging.getLogger("batchfutures")

__all__ = ["AWSClients", "CLIENT_CONFIG", "EXPIRED_TOKEN_CODES", "ExpiredTokenRetry",
           "owner_hook", "worker_storage_options", "OWNER_VARIABLE", "KMS_VARIABLE"]

CLIENT_CONFIG: Dict[str, Any] = {
    "retries": {"mode": "standard", "total_max_attempts": 1},  # batchapi / storage retry
    "connect_timeout": 10,
    "read_timeout": 60,
}
EXPIRED_TOKEN_CODES = frozenset({"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired"})
SHARED_METHOD = "batchfutures-shared"  # the credential provider name s3fs's session reports
REFRESH_COALESCE = 1.0  # seconds: concurrent ExpiredToken answers cause one refresh, not many


def force_refresh(credentials: Any) -> bool:
    """Refresh botocore RefreshableCredentials now, even before their expiry; False if static.

    botocore only refreshes ahead of the expiry it was told; a token revoked or expired early
    (a clock skew, a shortened session) needs a mandatory refresh. botocore has no public call
    for that, so this takes its refresh lock and runs its mandatory refresh, as botocore does
    itself inside the mandatory window.
    """
    refresh = getattr(credentials, "_protected_refresh", None)
    lock = getattr(credentials, "_refresh_lock", None)
    if refresh is None or lock is None:
        return False
    with lock:
        refresh(is_mandatory=True)
    return True


class ExpiredTokenRetry:
    """A botocore `needs-retry` handler: on ExpiredToken refresh the credentials, send once more."""

    def __init__(self, credentials: Any) -> None:
        self.credentials = credentials
        self.refreshes = 0  # for tests and logs
        self._lock = threading.Lock()
        self._last = -1e9

    def refresh(self) -> bool:
        with self._lock:
            if time.monotonic() - self._last < REFRESH_COALESCE:
                return True  # another request's answer just caused a refresh
            try:
                refreshed = force_refresh(self.credentials)
            except Exception as error:
                logger.warning("batchfutures: could not refresh expired AWS credentials: %s", error)
                return False
            if refreshed:
                self._last = time.monotonic()
                self.refreshes += 1
                logger.info("batchfutures: AWS credentials expired early; refreshed them")
            return refreshed

    def __call__(self, response: Any = None, attempts: int = 1, **_: Any) -> Optional[float]:
        if response is None or attempts > 1 or self.credentials is None:
            return None  # a transport error, or already sent again once: not ours to retry
        parsed = response[1] if isinstance(response, tuple) and len(response) > 1 else {}
        code = (parsed.get("Error") or {}).get("Code") if isinstance(parsed, dict) else None
        if code in EXPIRED_TOKEN_CODES and self.refresh():
            return 0.0  # botocore signs the request again, with the refreshed keys
        return None


def _shared_credentials(source: Any) -> Any:
    """botocore (synchronous) credentials as aiobotocore's signer and endpoint resolver ask."""
    # start-up: aiobotocore costs ~190 ms; only s3fs on AWS needs it (never a file:// worker)
    from aiobotocore.credentials import AioCredentials

    class SharedCredentials(AioCredentials):
        # botocore's properties read through to ``source``; no copy of a key is ever kept
        method = SHARED_METHOD

        def __init__(self) -> None:  # no super().__init__: nothing is stored but the source
            self.source = source

        async def get_frozen_credentials(self) -> Any:
            refresh_needed = getattr(source, "refresh_needed", None)
            if refresh_needed is not None and refresh_needed():
                # a refresh may call STS or SSO: off the event loop
                return await asyncio.to_thread(source.get_frozen_credentials)
            return source.get_frozen_credentials()

        def get_account_id(self) -> Optional[str]:
            return getattr(source.get_frozen_credentials(), "account_id", None)

        @property
        def access_key(self) -> str:
            return source.get_frozen_credentials().access_key

        @property
        def secret_key(self) -> str:
            return source.get_frozen_credentials().secret_key

        @property
        def token(self) -> Optional[str]:
            return source.get_frozen_credentials().token

        @property
        def account_id(self) -> Optional[str]:
            return self.get_account_id()

    return SharedCredentials()


def _shared_provider(credentials: Any) -> Any:
    from botocore.credentials import CredentialProvider  # start-up: ~40 ms; as AioCredentials'

    class SharedCredentialProvider(CredentialProvider):
        METHOD = SHARED_METHOD
        CANONICAL_NAME = "batchfutures"

        async def load(self) -> Any:  # aiobotocore awaits it
            return credentials

    return SharedCredentialProvider()


def owner_hook(owner: Callable[[], Optional[str]]) -> Callable[..., Any]:
    """A `before-parameter-build.s3` handler adding ExpectedBucketOwner where the model has it."""
    known: Dict[str, Optional[str]] = {}

    async def add_expected_owner(params: Dict[str, Any], model: Any, **_: Any) -> None:
        members = model.input_shape.members if model.input_shape is not None else {}
        if "ExpectedBucketOwner" not in members:
            return
        if "owner" not in known:
            known["owner"] = await asyncio.to_thread(owner)  # STS, once, off the event loop
        account = known["owner"]
        if not account:
            return
        params.setdefault("ExpectedBucketOwner", account)
        if "ExpectedSourceBucketOwner" in members and "CopySource" in params:
            params.setdefault("ExpectedSourceBucketOwner", account)  # copies stay in our bucket

    return add_expected_owner


# What a worker needs to keep the client's S3 guards: set in the job's environment by the client
# (AWSBatchEnvironment.worker_environment), read by the worker (worker_storage_options).
OWNER_VARIABLE = "BATCHFUTURES_EXPECTED_BUCKET_OWNER"
KMS_VARIABLE = "BATCHFUTURES_KMS_KEY_ID"


def worker_storage_options(environ: Dict[str, str]) -> Dict[str, Any]:
    """s3fs options for a worker: ExpectedBucketOwner and SSE-KMS from its environment.

    s3fs adds ``s3_additional_kwargs`` to each call whose model has the member (GetObject,
    PutObject, HeadObject, ListObjectsV2, DeleteObjects, multipart uploads).
    """
    extra: Dict[str, Any] = {}
    if environ.get(OWNER_VARIABLE):
        extra["ExpectedBucketOwner"] = environ[OWNER_VARIABLE]
    if environ.get(KMS_VARIABLE):
        extra.update(ServerSideEncryption="aws:kms", SSEKMSKeyId=environ[KMS_VARIABLE],
                     BucketKeyEnabled=True)  # KMS asked once per bucket key, not per object
    return {"s3_additional_kwargs": extra} if extra else {}


class AWSClients:
    """Clients of one boto3 Session, each made once under a lock, with one retry policy."""

    def __init__(self, session: Any, region_name: Optional[str]) -> None:
        self.session = session
        self.region_name = region_name
        self._clients: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._credentials: Any = None
        self._credentials_read = False
        self._expired: Optional[ExpiredTokenRetry] = None

    def credentials(self) -> Any:
        """The session's credentials object (refreshable where the source is), read once."""
        with self._lock:
            return self._credentials_locked()

    def _credentials_locked(self) -> Any:
        if not self._credentials_read:
            self._credentials = self.session.get_credentials()
            self._credentials_read = True
            self._expired = ExpiredTokenRetry(self._credentials)
        return self._credentials

    @property
    def expired_token_retry(self) -> ExpiredTokenRetry:
        with self._lock:
            self._credentials_locked()
            assert self._expired is not None
            return self._expired

    def client(self, service: str) -> Any:
        """The boto3 client of ``service`` (made once; thread-safe to use)."""
        with self._lock:
            made = self._clients.get(service)
            if made is None:
                # start-up: botocore.config costs ~40 ms, which a file:// worker never needs
                from botocore.config import Config

                self._credentials_locked()
                made = self.session.client(service, region_name=self.region_name,
                                           config=Config(**CLIENT_CONFIG))
                made.meta.events.register("needs-retry", self._expired)  # its own events only
                self._clients[service] = made
            return made

    def aio_session(self, *, expected_owner: Optional[Callable[[], Optional[str]]] = None) -> Any:
        """An aiobotocore session for s3fs that signs with this session's credentials."""
        from aiobotocore.session import AioSession  # start-up: as _shared_credentials'

        credentials = self.credentials()
        aio = AioSession()
        if credentials is not None:
            aio.get_component("credential_provider").providers.insert(
                0, _shared_provider(_shared_credentials(credentials)))
        aio.register("needs-retry.s3", self.expired_token_retry)
        if expected_owner is not None:
            aio.register("before-parameter-build.s3", owner_hook(expected_owner))
        return aio
