"""Signing: every object a worker or the client unpickles is authenticated with HMAC-SHA256.

Whoever can write the I/O bucket must not be able to run code on a worker (through a stored
function or inputs object) or on the client (through a result object). So each such object
carries a MAC under a key the bucket does not hold, and the reader checks it (hmac.compare_digest)
before it unpickles a byte.

    client (Session)                 bucket / folder                      worker (child i)
    ----------------                 ---------------                      ----------------
    seal("function", name, pickle) ─> functions/<sha>.pkl ──────────────> open(): check, unpickle
    write_inputs: header MAC in the   inputs: header + per-child tags ──> check header MAC, then
      header, tag per child blob                                           child i's tag, unpickle
    open("result", name, data) <───── results/<i> <──────────────────── seal("result", name, ...)
      IntegrityError, nothing
      unpickled, if it fails

What a MAC covers (``mac``): a domain string, the object's kind, the storage root it was written
under (``root``: ``s3://bucket/prefix`` or ``file:///path``, Storage.mac_root), its name (its key
relative to that root, e.g. ``runs/<run>/jobs/<job>/results/3``), then its bytes; each field is
length-prefixed. Root and name bind an object to its place: a validly signed result copied to
another child's slot, a function copied into another run, or a whole job copied to another
bucket or prefix under the same key, fails too. ``mac_stream`` computes the same MAC while the
last field (the object's bytes) is still being read, so a reader checks as it reads.

A sealed object (function, result, job pointer) is

    b"BFSEAL01" | 32-byte tag | payload

The inputs object's own layout (in storage.py) carries a MAC of its header inside the header and
a tag in front of each child's blob (``tag_i = mac(key, "inputs-child", name, i, header MAC,
blob_i)``), so a child checks only the bytes it reads: the prefix and its own byte range.

Where the key lives, and how each side finds it (the key itself never travels in a request, a
record or a log line; only WHERE it is does):

    where                       client                              worker
    --------------------------  ----------------------------------  ------------------------------
    AWS, Secrets Manager        AWSBatchEnvironment(signing_secret  GetSecretValue(ARN) through
                                =ARN): GetSecretValue through the   boto3's default chain (the job
                                env's boto3 session                 role may read only that secret)
    BATCHFUTURES_SIGNING_KEY    the variable in the client process  the same variable; on AWS the
                                (at least 32 characters)            user passes it to the container
                                                                    with secrets={...: ARN}
    local key file              <workdir>/signing.key, 64 hex       reads the same file; never
                                digits, created mode 0600 on first  creates one
                                use (atomically: a private
                                temporary linked into place);
                                opened O_NOFOLLOW, refused unless
                                the user's own and 0600

The client tells the job which one in its SubmitJob ``containerOverrides.environment``, through
one variable, ``BATCHFUTURES_SIGNING_KEY_SOURCE`` (``Signer.job_environment()``):

    file:<absolute path>         the key file
    secretsmanager:<secret ARN>  the secret
    env                          the container's BATCHFUTURES_SIGNING_KEY

A worker started without that variable (by hand, or by a test) uses BATCHFUTURES_SIGNING_KEY when
set, else the default workdir's key file. Precedence on the client: ``signing_secret=``, then
BATCHFUTURES_SIGNING_KEY, then (locally) the workdir's key file.

Rotating the key: write a new secret version (or delete the key file), and jobs submitted after
that use it; results of jobs signed with the old key no longer verify.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Protocol, Tuple, Union

from .errors import ConfigurationError, IntegrityError
from .workdir import check_private_file, default_workdir, make_private_dirs, open_private

__all__ = [
    "Signer", "mac", "mac_stream", "check", "check_digest", "seal", "unseal", "read_key_file",
    "default_signer", "job_signer",
    "local_signer", "aws_signer", "SEAL_MAGIC", "TAG_SIZE", "SOURCE_VARIABLE", "KEY_VARIABLE",
    "KEY_FILE_NAME", "REFUSED", "MIN_KEY_CHARACTERS",
]

SEAL_MAGIC = b"BFSEAL01"
TAG_SIZE = 32  # HMAC-SHA256
SOURCE_VARIABLE = "BATCHFUTURES_SIGNING_KEY_SOURCE"
KEY_VARIABLE = "BATCHFUTURES_SIGNING_KEY"
# the secret ARN a container's BATCHFUTURES_SIGNING_KEY was resolved from by ECS (the template)
KEY_FROM_VARIABLE = "BATCHFUTURES_SIGNING_KEY_FROM"
KEY_FILE_NAME = "signing.key"
MIN_KEY_CHARACTERS = 32
KEY_FILE_LIMIT = 4096  # bytes read of the key file at most
# The result-meta key under which a worker records that it refused its job's objects (a fixed
# JSON field, never a pickle: the client turns it into IntegrityError without unpickling).
REFUSED = "integrity_error"
_DOMAIN = b"batchfutures-signing-v2"  # v2: the storage root is a field
_U64 = struct.Struct("<Q")


# -- the pure functions --------------------------------------------------------------------------
Bytes = Union[bytes, bytearray, memoryview]


def mac_stream(key: bytes, kind: str, name: str, *parts: Bytes, root: str = "",
               tail: int) -> "hmac.HMAC":
    """The MAC of ``mac(key, kind, name, *parts, T, root=root)`` for a last field T of ``tail``
    bytes not read yet: every field and T's length are in; ``update`` it with T as it arrives."""
    digest = _fields(key, kind, root, name, parts)
    digest.update(_U64.pack(tail))
    return digest


def mac(key: bytes, kind: str, name: str, *parts: Bytes, root: str = "") -> bytes:
    """HMAC-SHA256 over the domain, ``kind``, ``root``, ``name`` and ``parts``, each
    length-prefixed."""
    return _fields(key, kind, root, name, parts).digest()


def _fields(key: bytes, kind: str, root: str, name: str, parts: Tuple[Bytes, ...]) -> "hmac.HMAC":
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for field in (_DOMAIN, kind.encode(), root.encode(), name.encode(), *parts):
        digest.update(_U64.pack(len(field)))
        digest.update(field)
    return digest


def seal(key: bytes, kind: str, name: str, payload: Bytes, *, root: str = "") -> bytes:
    """``payload`` as a sealed object: magic, its tag, the payload."""
    return b"".join([SEAL_MAGIC, mac(key, kind, name, payload, root=root), payload])


def unseal(key: bytes, kind: str, name: str, data: Bytes, *, root: str = "") -> bytes:
    """The payload of a sealed object; IntegrityError when it is unsigned or does not verify."""
    header = len(SEAL_MAGIC) + TAG_SIZE
    view = memoryview(data)
    if len(view) < header or bytes(view[:len(SEAL_MAGIC)]) != SEAL_MAGIC:
        raise IntegrityError(_unsigned(kind, name))
    payload = view[header:]
    if not hmac.compare_digest(bytes(view[len(SEAL_MAGIC):header]),
                               mac(key, kind, name, payload, root=root)):
        raise IntegrityError(_altered(kind, name))
    return bytes(payload)


def check(key: bytes, tag: Bytes, kind: str, name: str, *parts: Bytes, root: str = "") -> None:
    """IntegrityError unless ``tag`` is the MAC of these fields (compared in constant time)."""
    if not hmac.compare_digest(bytes(tag), mac(key, kind, name, *parts, root=root)):
        raise IntegrityError(_altered(kind, name))


def check_digest(tag: Bytes, digest: "hmac.HMAC", kind: str, name: str) -> None:
    """IntegrityError unless ``tag`` is what a ``mac_stream`` digest, now fed, ends with."""
    if not hmac.compare_digest(bytes(tag), digest.digest()):
        raise IntegrityError(_altered(kind, name))


def _unsigned(kind: str, name: str) -> str:
    return f"the {kind} object {name} is not signed; refusing to load it (nothing was unpickled)"


def _altered(kind: str, name: str) -> str:
    return (f"the {kind} object {name} failed its signature check: it was altered, or signed "
            f"with another key; nothing was unpickled")


# -- the key ------------------------------------------------------------------------------------
class Signer:
    """An HMAC key, loaded once on first use, and where it lives (what a job is told).

    ``load`` returns the key bytes (it may read a file or call Secrets Manager); ``source`` is
    the value of BATCHFUTURES_SIGNING_KEY_SOURCE for the jobs (never the key itself).
    """

    def __init__(self, load: Callable[[], bytes], source: str) -> None:
        self._load = load
        self.source = source
        self._key: Optional[bytes] = None
        self._lock = threading.Lock()

    @classmethod
    def from_key(cls, key: Union[bytes, str], source: str = "env") -> "Signer":
        """A signer over a key given here (tests, or a key the caller already holds)."""
        data = _key_bytes(key, "the signing key")
        return cls(lambda: data, source)

    @classmethod
    def from_key_file(cls, path: Union[str, os.PathLike], *, create: bool = False) -> "Signer":
        location = Path(path).expanduser().absolute()
        return cls(lambda: read_key_file(location, create=create), f"file:{location}")

    @classmethod
    def from_environment(cls, variable: str = KEY_VARIABLE) -> "Signer":
        def load() -> bytes:
            value = os.environ.get(variable)
            if not value:
                raise ConfigurationError(
                    f"no signing key: {variable} is not set in this process. On AWS Batch pass it "
                    f"to the container with secrets={{{variable!r}: <secret ARN>}}.")
            return _key_bytes(value, variable)
        return cls(load, "env")

    @classmethod
    def from_secrets_manager(cls, secret_arn: str, client: Callable[[], Any]) -> "Signer":
        """The key is the secret's value (SecretString or SecretBinary); ``client()`` makes the
        secretsmanager client, on first use."""
        def load() -> bytes:
            try:
                # retried there: the clients have botocore's retries off; start-up: batchapi
                # (botocore.exceptions, tenacity) adds ~4 ms to a worker's start, whose key is
                # rarely in Secrets Manager
                from . import batchapi

                response = batchapi.call(client().get_secret_value, SecretId=secret_arn)
            except Exception as error:  # the error names the secret and the code, not its value
                code = getattr(error, "response", {}).get("Error", {}).get("Code")
                raise ConfigurationError(
                    f"cannot read the signing key from Secrets Manager secret {secret_arn}: "
                    f"{code or type(error).__name__}") from None
            value = response.get("SecretBinary") or response.get("SecretString")
            return _key_bytes(value or b"", f"the secret {secret_arn}")
        return cls(load, f"secretsmanager:{secret_arn}")

    @classmethod
    def from_source(cls, source: str) -> "Signer":
        """The signer a job's BATCHFUTURES_SIGNING_KEY_SOURCE names (the worker's; creates nothing)."""
        scheme, _, where = source.partition(":")
        if scheme == "file" and where:
            return cls.from_key_file(where, create=False)
        if scheme == "secretsmanager" and where:
            if os.environ.get(KEY_VARIABLE) and os.environ.get(KEY_FROM_VARIABLE) == where:
                # ECS put this secret's value in the container (the stack's job definitions'
                # `secrets`): no call to Secrets Manager, which a multi-node node cannot reach
                return cls(lambda: _key_bytes(os.environ[KEY_VARIABLE], KEY_VARIABLE), source)
            return cls.from_secrets_manager(where, lambda: _worker_secretsmanager(where))
        if source == "env":
            return cls.from_environment()
        raise ConfigurationError(
            f"{SOURCE_VARIABLE} must be 'file:<path>', 'secretsmanager:<ARN>' or 'env'")

    @property
    def key(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = self._load()
            return self._key

    def job_environment(self) -> Dict[str, str]:
        """What a job's environment must carry for its worker to find this key."""
        return {SOURCE_VARIABLE: self.source}

    # the pure functions under this key
    def mac(self, kind: str, name: str, *parts: Bytes, root: str = "") -> bytes:
        return mac(self.key, kind, name, *parts, root=root)

    def mac_stream(self, kind: str, name: str, *parts: Bytes, root: str = "",
                   tail: int) -> "hmac.HMAC":
        return mac_stream(self.key, kind, name, *parts, root=root, tail=tail)

    def check(self, tag: Bytes, kind: str, name: str, *parts: Bytes, root: str = "") -> None:
        check(self.key, tag, kind, name, *parts, root=root)

    def seal(self, kind: str, name: str, payload: Bytes, *, root: str = "") -> bytes:
        return seal(self.key, kind, name, payload, root=root)

    def unseal(self, kind: str, name: str, data: Bytes, *, root: str = "") -> bytes:
        return unseal(self.key, kind, name, data, root=root)

    def __repr__(self) -> str:  # never the key
        return f"Signer(source={self.source!r})"


def _key_bytes(value: Union[bytes, str], what: str) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    if len(data.strip()) < MIN_KEY_CHARACTERS:
        raise ConfigurationError(
            f"{what} is too short for a signing key: use at least {MIN_KEY_CHARACTERS} characters "
            f"(for example `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return data.strip()


def read_key_file(path: Path, *, create: bool) -> bytes:
    """The key in ``path`` (hex); with ``create``, a new random key when there is none yet.

    A new file is written under a private temporary name with mode 0600 and linked into place,
    so it is never readable by others, not even for a moment, and two processes creating it at
    once end up with the same key.
    """
    if create and not path.exists():
        _create_key_file(path)
    try:
        # O_NOFOLLOW: a planted symlink is refused; O_NONBLOCK: a planted FIFO never blocks
        descriptor = open_private(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigurationError(
            f"no signing key: the key file {path} does not exist (the client creates it on "
            f"first use; a worker must be given the same file)") from None
    except OSError as error:  # ELOOP: a symbolic link
        raise ConfigurationError(
            f"refusing the signing key file {path}: it cannot be opened without following a "
            f"symbolic link ({error.strerror}). Fix: remove it (`rm {path}`); the next run "
            f"creates a new key") from None
    with os.fdopen(descriptor, "rb") as handle:
        # owned by this user and private to them: a key someone else planted forges results
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ConfigurationError(f"the signing key file {path} is not a regular file")
        check_private_file(handle.fileno(), path, "signing key file")
        text = handle.read(KEY_FILE_LIMIT).strip()  # a key is 64 hex digits, not any size
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigurationError(f"the signing key file {path} does not hold a hex key") from None
    if len(key) < MIN_KEY_CHARACTERS // 2:
        raise ConfigurationError(f"the signing key in {path} is shorter than 16 bytes")
    return key


def _create_key_file(path: Path) -> None:
    make_private_dirs(path.parent)
    temporary = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    # exactly 0600 whatever the umask, never through a symlink
    descriptor = open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            os.write(descriptor, secrets.token_hex(32).encode() + b"\n")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)  # fails if another process created it first: keep theirs
        except FileExistsError:
            pass
    finally:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass


def _worker_secretsmanager(secret_arn: str) -> Any:
    # start-up: boto3 costs ~70 ms; only a worker whose key is in Secrets Manager needs it
    import boto3

    parts = secret_arn.split(":")
    region = parts[3] if len(parts) > 3 and parts[3] else None
    return boto3.client("secretsmanager", region_name=region)


# -- which key, on each side --------------------------------------------------------------------
def default_signer(*, create: bool = True) -> Signer:
    """The key this process would use with no environment to say otherwise (a bare Storage).

    BATCHFUTURES_SIGNING_KEY_SOURCE when set, else BATCHFUTURES_SIGNING_KEY when set, else the
    default workdir's key file (created when ``create``).
    """
    source = os.environ.get(SOURCE_VARIABLE)
    if source:
        return Signer.from_source(source)
    if os.environ.get(KEY_VARIABLE):
        return Signer.from_environment()
    return Signer.from_key_file(default_workdir().resolve() / KEY_FILE_NAME, create=create)


def job_signer() -> Signer:
    """The worker's key: where its job's environment says; a worker never creates a key."""
    return default_signer(create=False)


def local_signer(workdir: Union[str, os.PathLike]) -> Signer:
    """LocalEnvironment's key: BATCHFUTURES_SIGNING_KEY when set, else ``<workdir>/signing.key``."""
    if os.environ.get(KEY_VARIABLE):
        return Signer.from_environment()
    return Signer.from_key_file(Path(workdir) / KEY_FILE_NAME, create=True)


class SecretHolder(Protocol):
    """What `aws_signer` reads of an environment (environments.Environment declares both)."""

    @property
    def signing_secret(self) -> Optional[str]: ...

    def client(self, service: str) -> Any: ...


def aws_signer(env: SecretHolder) -> Signer:
    """AWSBatchEnvironment's key: its ``signing_secret`` ARN, else BATCHFUTURES_SIGNING_KEY.

    With neither, the first payload written raises ConfigurationError saying how to give one.
    """
    secret_arn = env.signing_secret
    if secret_arn:
        return Signer.from_secrets_manager(secret_arn, lambda: env.client("secretsmanager"))
    if os.environ.get(KEY_VARIABLE):
        return Signer.from_environment()

    def missing() -> bytes:
        raise ConfigurationError(
            "AWSBatchEnvironment needs a signing key for its payloads: export "
            "BATCHFUTURES_SIGNING_SECRET=<the stack's SigningSecret output> (docs/aws.md, step "
            "3), or AWSBatchEnvironment(..., signing_secret=<Secrets Manager secret ARN or "
            f"name>), or {KEY_VARIABLE} in the environment (at least {MIN_KEY_CHARACTERS} "
            "characters)")
    return Signer(missing, "env")


