"""File access under a table's root, for the metadata pylance does not expose.

Backed by ``pyarrow.fs`` so the same code reads a local directory or an object
store URI (``s3://...``). All paths are relative to the table root.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    mtime_ns: int | None


class TableStorage:
    """Read-mostly access to files below one Lance table's root."""

    def __init__(self, uri: str) -> None:
        self.fs, root = pafs.FileSystem.from_uri(uri)
        self.root = root.rstrip("/")

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def read_bytes(self, relative: str) -> bytes:
        """The whole file; ``FileNotFoundError`` if it does not exist."""
        with self.fs.open_input_file(self.path(relative)) as f:
            data: bytes = f.read()
        return data

    def exists(self, relative: str) -> bool:
        found: bool = self.fs.get_file_info(self.path(relative)).type != pafs.FileType.NotFound
        return found

    def list_dir(self, relative: str) -> list[FileEntry]:
        """Direct children of a directory (empty if it does not exist)."""
        selector = pafs.FileSelector(self.path(relative), allow_not_found=True, recursive=False)
        return [FileEntry(info.base_name, info.size or 0, info.mtime_ns) for info in self.fs.get_file_info(selector)]

    def move(self, relative: str, to: str) -> None:
        """Move a file (a rename where the store has one), creating ``to``'s directory."""
        destination = self.path(to)
        self.fs.create_dir(destination.rsplit("/", 1)[0], recursive=True)
        self.fs.move(self.path(relative), destination)

    def delete_file(self, relative: str) -> None:
        self.fs.delete_file(self.path(relative))

    def delete_dir(self, relative: str) -> None:
        """Delete a directory and everything below it; nothing if it does not exist."""
        if self.exists(relative):
            self.fs.delete_dir(self.path(relative))

    def write_bytes_atomic(self, relative: str, data: bytes) -> None:
        """Write a file so that readers see either nothing or all of it.

        Local files are written under a temporary name and renamed; object
        stores make a single PUT visible atomically anyway.
        """
        path = self.path(relative)
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        staging = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(staging) as out:
            out.write(data)
        self.fs.move(staging, path)
