"""Object resources (the JSON API's) into `ObjectInfo`: one parser for stats, uploads'
answers and listings.

Listings build their entries from the items directly (`item_info`): a `storage.Blob`
each, with its ACL objects, was ~8 of the ~19 us of daemon CPU a listed entry cost
(10,000 entries of a cold stat storm, against the emulator).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from google.cloud import storage
from google.cloud._helpers import _rfc3339_nanos_to_datetime

from tierfs.errors import BackendError
from tierfs.storage import ObjectInfo


def _info(blob: storage.Blob) -> ObjectInfo:
    """An `ObjectInfo` from the object resource the server returned."""
    return info_of(blob._properties)


def info_of(resource: Mapping[str, Any]) -> ObjectInfo:
    """An `ObjectInfo` from an object resource, as a stat or a listing's item returns it."""
    name = resource.get("name", "")
    generation = resource.get("generation")
    if generation is None:
        raise BackendError(f"{name}: the server returned an object without a generation")
    return ObjectInfo(
        name=name,
        size=int(resource.get("size") or 0),
        generation=int(generation),
        metageneration=int(resource.get("metageneration") or 1),
        updated_s=_updated_s(resource.get("updated")),
        metadata=dict(resource.get("metadata") or {}),
        content_type=resource.get("contentType"),
        crc32c=resource.get("crc32c"),
    )


def item_info(_iterator: object, item: dict[str, Any]) -> ObjectInfo:
    """A listing iterator's ``item_to_value``: the item's `ObjectInfo`, no Blob made."""
    return info_of(item)


def _updated_s(text: str | None) -> float:
    """The object's update time, in seconds since the epoch, from the resource's RFC 3339
    text with `datetime.fromisoformat` (0.2 us; the library's strptime took ~25 us, which
    was most of the daemon's CPU for each entry of a listing)."""
    if not text:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        try:  # (whatever else the library's own parser takes)
            return _rfc3339_nanos_to_datetime(text).timestamp()
        except ValueError:
            return 0.0


class UploadBlob(storage.Blob):
    """A blob to upload to, which the library never deletes.

    When a resumable upload's checksum does not match, google-cloud-storage deletes "the
    corrupted object" with ``self.delete()``: no generation, so whatever is live by then,
    another client's newer object included, and retried. The generation the session made
    is ours and is replaced (or kept) by the uploader itself, conditionally on it
    (`tierfs.storage.gcs_upload`); and on GCS that delete left the upload's own retry,
    conditional on the deleted generation, failing its precondition."""

    def delete(self, *args: Any, **kwargs: Any) -> None:
        """Does nothing: see the class. (tierfs's own deletes: `GcsBucket.delete`.)"""


def upload_blob(bucket: storage.Bucket, name: str, chunk_size: int) -> UploadBlob:
    """`UploadBlob` ``name`` of ``bucket``, sent in chunks of ``chunk_size`` bytes."""
    return UploadBlob(name, bucket=bucket, chunk_size=chunk_size)
