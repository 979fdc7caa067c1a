"""Object storage (the S3 API: AWS S3, MinIO, Ceph, SeaweedFS, Alibaba OSS, GCS's S3 endpoint) as a
data source and as the destination of a prepared dataset.

    data_root=s3://bucket/prefix

Credentials and endpoint come from boto3's usual chain: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_PROFILE and ~/.aws. Clips are read as whole
objects into a node-local cache under a byte budget (`ClipCache`): prepared clips are small,
and a decoder seeks far more efficiently in a local file than over HTTP ranges. Connection
errors, timeouts, throttling and server errors are retried with exponential backoff for up to
`retry_s` seconds per request; past that the request raises `StorageUnavailable`, which the
training loop turns into a stop agreed by every rank (docs/data.md). A missing object is a
broken clip like any other (`ClipError`), skipped and counted.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

REMOTE_PREFIX = "s3://"


def is_remote(location) -> bool:
    return str(location).startswith(REMOTE_PREFIX)


class StorageError(ValueError):
    """The store cannot be used as configured (no such bucket, refused credentials, no endpoint):
    one line naming it, before any heavy work."""


class StorageUnavailable(RuntimeError):
    """The store did not answer within the retry limit."""


def split_url(url: str) -> tuple[str, str]:
    """s3://bucket/a/b/ -> ("bucket", "a/b")."""
    bucket, _, prefix = str(url)[len(REMOTE_PREFIX):].partition("/")
    if not bucket:
        raise StorageError(f"{url!r} names no bucket: use s3://bucket/prefix")
    return bucket, prefix.strip("/")


def _is_transient(error: Exception) -> bool:
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(error, (ConnectionError, HTTPClientError)):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = error.response.get("Error", {}).get("Code", "")
        return status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout", "ServiceUnavailable", "InternalError")
    return False


def _is_missing(error: Exception) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(error, ClientError) and error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


class ObjectStore:
    """One s3://bucket/prefix; paths are relative to the prefix. The boto3 client is made per
    process on first use (loader workers are forked and need their own)."""

    def __init__(self, url: str, retry_s: float = 600.0):
        self.url = str(url).rstrip("/")
        self.bucket, self.prefix = split_url(self.url)
        self.retry_s = retry_s
        self._client, self._client_pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_client": None, "_client_pid": None}

    @property
    def client(self):
        if self._client is None or self._client_pid != os.getpid():
            import boto3
            from botocore.config import Config

            config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=60)
            self._client, self._client_pid = boto3.session.Session().client("s3", config=config), os.getpid()
        return self._client

    @property
    def endpoint(self) -> str:
        return self.client.meta.endpoint_url

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def _call(self, what: str, request):
        """request() with retries of transient failures, backing off from 0.5 s to 15 s, for up to retry_s."""
        started, delay, failures = time.monotonic(), 0.5, 0
        while True:
            try:
                answer = request()
                if failures:
                    print(f"object store {self.endpoint} answered {what} again after {time.monotonic() - started:.0f} s",
                          file=sys.stderr, flush=True)
                return answer
            except Exception as error:
                if not _is_transient(error):
                    raise
                failures += 1
                waited = time.monotonic() - started
                if failures == 1:  # one line per outage and process, not one per retry
                    print(f"object store {self.endpoint} did not answer {what} ({type(error).__name__}): retrying for up to "
                          f"storage_retry_s={self.retry_s:g} s", file=sys.stderr, flush=True)
                if waited + delay > self.retry_s:
                    raise StorageUnavailable(f"object store {self.endpoint} did not answer {what} for {waited:.0f} s "
                                             f"(storage_retry_s={self.retry_s:g}; {type(error).__name__})") from None
                time.sleep(delay)
                delay = min(delay * 2, 15.0)

    def list(self, suffixes: set[str] | None = None) -> list[tuple[str, int]]:
        """(relative path, size) of every object under the prefix (with one of `suffixes`), sorted."""
        start = f"{self.prefix}/" if self.prefix else ""

        def pages():
            found = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                found += [(item["Key"][len(start):], item["Size"]) for item in page.get("Contents", [])]
            return found

        found = self._call(f"listing {self.url}", pages)
        return sorted((k, s) for k, s in found if suffixes is None or Path(k).suffix.lower() in suffixes)

    def read(self, relative: str) -> bytes:
        return self._call(f"reading {self.url}/{relative}",
                          lambda: self.client.get_object(Bucket=self.bucket, Key=self.key(relative))["Body"].read())

    def exists(self, relative: str) -> bool:
        def head():
            try:
                self.client.head_object(Bucket=self.bucket, Key=self.key(relative))
                return True
            except Exception as error:
                if _is_missing(error):
                    return False
                raise

        return self._call(f"looking up {self.url}/{relative}", head)

    def download(self, relative: str, local: Path) -> None:
        """Whole object to `local`, written under a temporary name first."""
        temporary = local.with_name(f".{local.name}.{os.getpid()}.part")
        try:
            self._call(f"reading {self.url}/{relative}",
                       lambda: self.client.download_file(self.bucket, self.key(relative), str(temporary)))
            os.replace(temporary, local)
        finally:
            temporary.unlink(missing_ok=True)

    def upload(self, local: Path, relative: str) -> None:
        self._call(f"writing {self.url}/{relative}", lambda: self.client.upload_file(str(local), self.bucket, self.key(relative)))

    def write_bytes(self, relative: str, data: bytes) -> None:
        self._call(f"writing {self.url}/{relative}",
                   lambda: self.client.put_object(Bucket=self.bucket, Key=self.key(relative), Body=data))

    def problem(self) -> str:
        """'' when the bucket answers a listing with these credentials, else one line saying what is wrong."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(""), MaxKeys=1)
            return ""
        except NoCredentialsError:
            return (f"data_root={self.url!r}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                    "(or AWS_PROFILE)")
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket", "404"):
                return f"data_root={self.url!r}: bucket {self.bucket!r} does not exist at {self.endpoint}: fix the bucket name or AWS_ENDPOINT_URL"
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return (f"data_root={self.url!r}: {self.endpoint} refused the credentials ({code}): check AWS_ACCESS_KEY_ID "
                        f"and AWS_SECRET_ACCESS_KEY, and that they may list bucket {self.bucket!r}")
            return f"data_root={self.url!r}: {self.endpoint} answered {code}: {error}"
        except (BotoCoreError, OSError) as error:
            return f"data_root={self.url!r}: cannot reach the object store at {self.endpoint} ({error}): check AWS_ENDPOINT_URL"


def default_cache_dir() -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"taehv-data-cache-{os.getuid()}"


class ClipCache:
    """Objects copied to local files, kept up to `budget_bytes` in all (least recently used go
    first). Budget 0: each fetch is a private copy deleted on release. Loader workers of every rank
    on a node share one folder; every file is written under a temporary name and renamed."""

    def __init__(self, folder: Path | str = "", budget_bytes: int = 20 * 10**9):
        self.folder, self.budget_bytes = Path(folder or default_cache_dir()), int(budget_bytes)
        self._fetched_since_trim = 0

    def fetch(self, store: ObjectStore, relative: str) -> Path:
        name = hashlib.sha1(f"{store.url}/{relative}".encode()).hexdigest() + Path(relative).suffix
        if self.budget_bytes <= 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{os.getpid()}-{name}"
            store.download(relative, path)
            return path
        path = self.folder / name[:2] / name
        try:
            os.utime(path)  # a hit: most recently used now
            return path
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        store.download(relative, path)
        self._fetched_since_trim += path.stat().st_size
        if self._fetched_since_trim > self.budget_bytes / 32:
            self.trim()
        return path

    def release(self, path: Path) -> None:
        if self.budget_bytes <= 0:
            path.unlink(missing_ok=True)

    def trim(self) -> None:
        """Deletes the least recently used files until the folder is within budget."""
        self._fetched_since_trim = 0
        files = []
        for entry in self.folder.glob("??/*"):
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue  # another worker's trim took it
            files.append((stat.st_mtime, stat.st_size, entry))
        total = sum(size for _, size, _ in files)
        for _, size, entry in sorted(files, key=lambda f: f[0]):
            if total <= self.budget_bytes:
                break
            entry.unlink(missing_ok=True)
            total -= size
