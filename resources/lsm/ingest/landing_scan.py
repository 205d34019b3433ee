"""What an ingestion takes from the landing directory: the scan policy, without Spark.

One listing of the landing directory and one of the ledger decide, per file:
ingest it now, leave it (still being written, or a changed file under a
recorded name), or retire it (recorded by a run that crashed before retiring
it). Everything else the directory holds is reported, never read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..format.storage import StorageOptions, TableStorage
from .landing import IngestLedger, LandingFile, LandingLocation, LandingPolicy, LandingRetention, LedgerEntry


@dataclass(frozen=True)
class LandingScan:
    """What a look at the landing directory found, beyond the files to ingest.

    Attributes
    ----------
    pending
        Files to ingest now, in file-name order.
    changed
        Recorded names landed again with another size: name → what happened.
    incomplete
        Files that look still being written; left for the next run.
    unsupported
        Entries that are no landing file (extension, dangling link...): name → why.
    landing_dir_missing
        The landing directory does not exist.
    """

    pending: list[LandingFile]
    changed: dict[str, str] = field(default_factory=dict)
    incomplete: tuple[str, ...] = ()
    unsupported: dict[str, str] = field(default_factory=dict)
    landing_dir_missing: bool = False


def scan_landing(
    ledger: IngestLedger,
    landing: LandingLocation,
    retention: LandingRetention = LandingRetention(),
    policy: LandingPolicy = LandingPolicy(),
) -> LandingScan:
    """Look at the landing directory: the complete files to ingest, and everything else worth reporting.

    Recorded files still in the landing directory (a crash came between
    recording and retiring them) are retired now, if they are the very file
    recorded (same size). A different file under a recorded name is reported
    in ``changed`` and, per ``policy.changed_files``, left (default) or
    ingested. Files that look still being written
    (:meth:`~resources.lsm.ingest.landing.LandingLocation.is_complete`) are
    left for a later run. The landing directory and the ledger are listed
    once each.
    """
    done = ledger.ingested_names()
    listing = landing.listing()
    refused = {f.name: reason for f in listing.files if (reason := policy.refusal(f.name))}
    files = [f for f in listing.files if f.name not in refused]
    entries = {f.name: ledger.entry(f.name) for f in files if f.name in done}
    landing.retire([f.name for f in files if _same_size(entries.get(f.name), f)], retention)
    changed = {f.name: _changed_reason(f, entries[f.name], policy) for f in files if _is_changed(entries, f)}
    new = [f for f in files if f.name not in done or (f.name in changed and policy.changed_files == "ingest")]
    complete = [f for f in new if landing.is_complete(f, policy.settle_seconds)]
    return LandingScan(
        pending=complete,
        changed=changed,
        incomplete=tuple(f.name for f in new if f not in complete),
        unsupported={**listing.unsupported, **refused},
        landing_dir_missing=not listing.exists,
    )


def pending_landing_files(
    table_uri: str,
    landing_dir: str,
    retention: LandingRetention = LandingRetention(),
    storage_options: StorageOptions | None = None,
) -> list[LandingFile]:
    """Landing files not yet recorded in the table's ledger, in file-name order (see :func:`scan_landing`)."""
    ledger = IngestLedger(TableStorage(table_uri, storage_options))
    return scan_landing(ledger, LandingLocation(landing_dir, storage_options), retention).pending


def _same_size(entry: LedgerEntry | None, file: LandingFile) -> bool:
    return entry is not None and entry.size == file.size


def _is_changed(entries: dict[str, LedgerEntry | None], file: LandingFile) -> bool:
    return file.name in entries and not _same_size(entries[file.name], file)


def _changed_reason(file: LandingFile, entry: LedgerEntry | None, policy: LandingPolicy) -> str:
    recorded = "?" if entry is None else entry.size
    action = "ingested again" if policy.changed_files == "ingest" else "skipped, left in place"
    return (
        f"landed again with {file.size} bytes, but a file of this name with {recorded} bytes was already "
        f"ingested: {action} (changed_files={policy.changed_files!r})"
    )
