"""File access under a table's root, for the metadata pylance does not expose.

Backed by ``pyarrow.fs`` so the same code reads a local directory or an object
store URI (``s3://...``). All paths are relative to the table root.
:func:`filesystem` resolves any location (table, landing directory,
quarantine, a landing file) the same way.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from .retry import DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_MAX_RETRIES, RetryPolicy, duration_seconds, option, retrying

_T = TypeVar("_T")

StorageOptions: TypeAlias = dict[str, str]
"""Lance's object-store options (``aws_endpoint``, ``aws_region``, ``allow_http``, ...).

Keys are case-insensitive, as in Lance. ``None`` or empty: the standard
``AWS_*`` environment variables configure both Lance and pyarrow.
"""

# Lance storage-option keys (object_store's S3 aliases) -> pyarrow.fs.S3FileSystem arguments.
_S3_ARGUMENTS = {
    "aws_access_key_id": "access_key",
    "access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "session_token": "session_token",
    "aws_region": "region",
    "region": "region",
    "aws_endpoint": "endpoint_override",
    "aws_endpoint_url": "endpoint_override",
    "endpoint": "endpoint_override",
    "endpoint_url": "endpoint_override",
}

_S3_ENVIRONMENT = {
    "endpoint_override": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}


def filesystem(location: str, storage_options: StorageOptions | None = None) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` filesystem holding ``location`` and its path there (no trailing ``/``).

    ``location`` is a local path (made absolute, as today) or a URI. An
    ``s3://`` URI with ``storage_options`` gets an ``S3FileSystem`` built
    from the options pyarrow understands (credentials, region, endpoint: an
    ``http://`` endpoint is used as plain HTTP); anything the options leave
    out comes from the environment, as for every other URI. Every ``s3://``
    filesystem retries requests as Lance does (``client_max_retries``,
    ``connect_timeout``). Nothing is contacted until the filesystem is used.
    """
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location)
    if location.startswith("s3://"):
        return _s3_filesystem(storage_options or {}), location.removeprefix("s3://").rstrip("/")
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path.rstrip("/")


def _s3_filesystem(storage_options: StorageOptions) -> pafs.S3FileSystem:
    arguments = {_S3_ARGUMENTS[k.lower()]: v for k, v in storage_options.items() if k.lower() in _S3_ARGUMENTS}
    # What pyarrow's from_uri would take from the environment, and its constructor does not.
    for argument, variables in _S3_ENVIRONMENT.items():
        found = next((os.environ[v] for v in variables if os.environ.get(v)), None)
        if argument not in arguments and found:
            arguments[argument] = found
    retries = option(storage_options, "client_max_retries", "OBJECT_STORE_CLIENT_MAX_RETRIES")
    connect = option(storage_options, "connect_timeout", "OBJECT_STORE_CONNECT_TIMEOUT")
    return pafs.S3FileSystem(
        **arguments,
        # The AWS SDK counts attempts, Lance counts retries.
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1 + int(retries or DEFAULT_MAX_RETRIES)),
        connect_timeout=duration_seconds(connect) if connect else DEFAULT_CONNECT_TIMEOUT_SECONDS,
    )


def join(location: str, name: str) -> str:
    """``name`` below the directory ``location``: a URI, or an absolute local path."""
    return f"{location.rstrip('/')}/{name}" if "://" in location else os.path.join(os.path.abspath(location), name)


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    mtime_ns: int | None
    is_file: bool = True
    """``False`` for a directory (or anything else that is not a regular file)."""


class TableStorage:
    """Read-mostly access to files below one root directory (a table's, a landing directory).

    ``storage_options`` as for :func:`filesystem`: the options the table was opened with.

    Every method retries transient store errors (:func:`~resources.lsm.format.retry.retrying`,
    deadline ``client_retry_timeout``) and then raises ``StorageUnavailableError``.
    """

    def __init__(self, uri: str, storage_options: StorageOptions | None = None) -> None:
        self.fs, self.root = filesystem(uri, storage_options)
        self.location, self.storage_options = uri, storage_options
        self.retry_policy = RetryPolicy.from_options(storage_options)

    def retrying(self, call: Callable[[], _T], operation: str, before_retry: Callable[[], object] | None = None) -> _T:
        """``call()`` with this location's retries (it must be safe to repeat); see :func:`retrying`."""
        return retrying(call, operation, self.location, self.retry_policy, before_retry)

    @property
    def is_local(self) -> bool:
        """Whether the files are on a local disk (reads take microseconds, not a round trip)."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def uri(self, relative: str) -> str:
        """``relative`` as Lance opens it (a URI, or an absolute local path); pass :attr:`storage_options` too."""
        return join(self.location, relative)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def read_bytes(self, relative: str) -> bytes:
        """The whole file; ``FileNotFoundError`` if it does not exist."""

        def read() -> bytes:
            with self.fs.open_input_file(self.path(relative)) as f:
                data: bytes = f.read()
            return data

        return self.retrying(read, f"read {relative}")

    def read_buffer(self, relative: str) -> pa.Buffer:
        """The whole file as an Arrow buffer (no copy); ``FileNotFoundError`` if it does not exist."""

        def read() -> pa.Buffer:
            with self.fs.open_input_file(self.path(relative)) as f:
                return f.read_buffer()

        return self.retrying(read, f"read {relative}")

    def read_ends(self, relative: str, length: int, size: int) -> tuple[bytes, bytes]:
        """The first and the last ``length`` bytes of a file of ``size`` bytes (two ranged reads)."""

        def read() -> tuple[bytes, bytes]:
            with self.fs.open_input_file(self.path(relative)) as f:
                head: bytes = f.read(length)
                f.seek(max(0, size - length))
                return head, f.read()

        return self.retrying(read, f"read the ends of {relative}")

    def exists(self, relative: str) -> bool:
        found: bool = self.info(relative).type != pafs.FileType.NotFound
        return found

    def list_dir(self, relative: str) -> list[FileEntry]:
        """Direct children of a directory (empty if it does not exist)."""
        return [
            FileEntry(info.base_name, info.size or 0, info.mtime_ns, info.type == pafs.FileType.File)
            for info in self._children(relative)
        ]

    def list_files(self, relative: str) -> list[FileEntry]:
        """Direct children of a directory that are files, not directories (empty if it does not exist)."""
        files = (info for info in self._children(relative) if info.type == pafs.FileType.File)
        return [FileEntry(info.base_name, info.size or 0, info.mtime_ns) for info in files]

    def list_files_named(self, relative: str, wanted: Callable[[str], bool]) -> list[FileEntry]:
        """The files of a directory whose name passes ``wanted`` (empty if the directory does not exist).

        An object store lists sizes and times with the names anyway; a local
        listing would stat every entry, so there only the wanted files are.
        """
        if not self.is_local:
            return [entry for entry in self.list_files(relative) if wanted(entry.name)]
        directory = self.path(relative)

        def stat_wanted() -> list[FileEntry]:
            try:
                paths = [f"{directory}/{name}" for name in os.listdir(directory) if wanted(name)]
            except FileNotFoundError:
                return []
            infos = self.fs.get_file_info(paths)
            return [FileEntry(i.base_name, i.size or 0, i.mtime_ns) for i in infos if i.type == pafs.FileType.File]

        return self.retrying(stat_wanted, f"list {relative}")

    def _children(self, relative: str, recursive: bool = False) -> list[pafs.FileInfo]:
        """What a directory holds (at any depth if ``recursive``); empty if it does not exist."""
        selector = pafs.FileSelector(self.path(relative), allow_not_found=True, recursive=recursive)
        operation = f"list {relative}/**" if recursive else f"list {relative}"
        infos: list[pafs.FileInfo] = self.retrying(lambda: self.fs.get_file_info(selector), operation)
        return infos

    def move(self, relative: str, to: str) -> None:
        """Move a file (a rename where the store has one), creating ``to``'s directory.

        A retry that finds the source gone and the destination there counts
        as done: the failed attempt was applied.
        """
        destination = self.path(to)

        def move(retry: bool) -> None:
            self.fs.create_dir(destination.rsplit("/", 1)[0], recursive=True)
            try:
                self.fs.move(self.path(relative), destination)
            except FileNotFoundError:
                if not retry or self.fs.get_file_info(destination).type == pafs.FileType.NotFound:
                    raise

        self._repeatable(move, f"move {relative}")

    def delete_file(self, relative: str) -> None:
        """Delete a file; ``FileNotFoundError`` if it does not exist (unless a failed attempt deleted it)."""
        self._delete(self.fs.delete_file, relative, f"delete {relative}")

    def _repeatable(self, call: Callable[[bool], None], operation: str) -> None:
        """:meth:`retrying` for a ``call`` told whether it is a retry (an earlier attempt may have been applied)."""
        attempts = itertools.count()
        self.retrying(lambda: call(next(attempts) > 0), operation)

    def delete_dir(self, relative: str) -> None:
        """Delete a directory and everything below it; nothing if it does not exist (or a failed attempt did it)."""
        if self.exists(relative):
            self._delete(self.fs.delete_dir, relative, f"delete {relative}/")

    def _delete(self, delete: Callable[[str], None], relative: str, operation: str) -> None:
        """``delete(path)``, retried; a retry that finds the path gone counts as done (an attempt applied it)."""

        def attempt(retry: bool) -> None:
            try:
                delete(self.path(relative))
            except FileNotFoundError:
                if not retry:
                    raise

        self._repeatable(attempt, operation)

    def info(self, relative: str) -> pafs.FileInfo:
        """What the store says about one path (type, size, modification time)."""
        found: pafs.FileInfo = self.retrying(lambda: self.fs.get_file_info(self.path(relative)), f"stat {relative}")
        return found

    def files_below(self, relative: str) -> list[pafs.FileInfo]:
        """Every file below a directory, at any depth (empty if it does not exist)."""
        return [info for info in self._children(relative, recursive=True) if info.type == pafs.FileType.File]

    def write_bytes_atomic(self, relative: str, data: bytes) -> None:
        """Write a file so that readers see either nothing or all of it.

        Local files are written under a temporary name and renamed; object
        stores make a single PUT visible atomically anyway.
        """
        path = self.path(relative)

        def write() -> None:
            # A fresh staging name per attempt: a failed attempt's leftover is never moved.
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            staging = f"{path}.{uuid.uuid4().hex}.tmp"
            with self.fs.open_output_stream(staging) as out:
                out.write(data)
            self.fs.move(staging, path)

        self.retrying(write, f"write {relative}")
