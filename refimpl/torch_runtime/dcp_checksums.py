"""Checksums of DCP checkpoints: written beside each data file at save, verified before a load uses a byte.

Theory of operation
-------------------
DCP's file-system writer stores every saved item (a tensor, or a chunk of a
sharded one) as a byte range of a data file (``__0_0.distcp``) and records
the range in the checkpoint's metadata. DCP itself checks nothing: a flipped
bit loads as a wrong weight. Here:

* Save: when the writer's ``write_data`` has written this rank's items,
  :func:`checksummed` reads each item's byte range back from the file and
  writes its CRC-32 to a side file beside the data file
  (``__0_0.distcp.crc32.json``: ``{offset: {length, crc32, tensor}}``). The
  checksum covers the bytes on disk, so whatever DCP's serialisation, and
  whatever reshards the load does later, the stored item is what is checked.
* The metadata: the coordinator's ``finish`` writes ``.metadata`` (where every
  chunk sits in its tensor and in its file); :func:`checksummed` then writes
  its length and CRC-32 beside it (``.metadata.crc32.json``). A flipped bit in
  a chunk's offsets or sizes would otherwise load without error, part of a
  shard left unread.
* Load: before the reader's ``read_metadata`` unpickles anything,
  :func:`verified` compares the metadata file with its side file; before its
  ``read_data`` copies anything, it reads every byte range this rank's load
  plan uses and compares length and CRC-32 with the side file. A missing side
  file, a short file (truncated) or a different CRC raise
  :class:`~refimpl.store.CheckpointIntegrityError` naming the tensor (if any)
  and the file. DCP gathers that error from the failing rank to all ranks, so
  every rank's load fails and (with the staged load of
  :func:`refimpl.torch_runtime.dcp.load_into`) no target is touched. DCP
  catches any ``Exception`` from ``read_metadata`` (to try rank-local
  metadata) and then reports only "metadata is None", so the metadata's
  refusal travels as :class:`~refimpl.torch_runtime.dcp_staging.CarriedError`,
  which that handler lets through and :func:`~refimpl.torch_runtime.dcp_staging.failed`
  unwraps.

Both wrap the bound method of the writer or reader instance for the length of
one save or load and put it back afterwards, so any ``FileSystemWriter`` /
``FileSystemReader`` subclass (or another writer with ``fs`` and ``path``)
works, and the checkpoint stays a plain DCP checkpoint that torch loads
without this module. Cost: the save reads its bytes back once and the load
reads them twice (the second time from the page cache); CRC-32 runs at about
1.5 GiB/s per core (figures in docs/store.md).
"""
from __future__ import annotations

import contextlib
import json
import logging
import zlib
from typing import Any, Iterable, Iterator

from refimpl.store.errors import CheckpointIntegrityError
from refimpl.torch_runtime.dcp_staging import CarriedError

log = logging.getLogger(__name__)

SUFFIX = ".crc32.json"
#: the name DCP's file-system storage gives the global metadata file (``__<rank>.metadata`` when rank-local)
METADATA_NAME = ".metadata"
CHUNK_BYTES = 32 << 20


def file_based(storage: Any) -> bool:
    """True if ``storage`` (a DCP writer or reader) keeps its items in files it can open (``fs``, ``path``)."""
    fs = getattr(storage, "fs", None)
    return callable(getattr(fs, "create_stream", None)) and getattr(storage, "path", None) is not None


def crc32_range(stream: Any, offset: int, length: int) -> tuple[int, int]:
    """``(crc32, bytes read)`` of ``length`` bytes of ``stream`` from ``offset``; fewer bytes read means
    the file ends early."""
    stream.seek(offset)
    crc, done = 0, 0
    buf = memoryview(bytearray(min(CHUNK_BYTES, max(length, 1))))
    while done < length:
        want = min(len(buf), length - done)
        n = stream.readinto(buf[:want]) if hasattr(stream, "readinto") else _read_into(stream, buf, want)
        if not n:
            break
        crc = zlib.crc32(buf[:n], crc)
        done += n
    return crc, done


def _read_into(stream: Any, buf: memoryview, want: int) -> int:
    data = stream.read(want)
    buf[:len(data)] = data
    return len(data)


def _item_name(index: Any) -> str:
    """A saved item's name for messages: the tensor's fqn, with the chunk's offset if it is one of several."""
    offset = getattr(index, "offset", None)
    if offset is not None and any(offset):
        return f"{index.fqn} (chunk at {tuple(offset)})"
    return index.fqn


def write_checksums(writer: Any, results: Iterable[Any]) -> int:
    """Read back every item of ``results`` (DCP ``WriteResult`` s) from its data file and write the side
    files; returns how many items were summed."""
    by_file: dict[str, list[Any]] = {}
    for r in results:
        by_file.setdefault(r.storage_data.relative_path, []).append(r)
    fs, done = writer.fs, 0
    for rel, items in sorted(by_file.items()):
        table: dict[str, dict[str, Any]] = {}
        with fs.create_stream(fs.concat_path(writer.path, rel), "rb") as stream:
            for r in sorted(items, key=lambda r: r.storage_data.offset):
                info = r.storage_data
                crc, got = crc32_range(stream, info.offset, info.length)
                if got != info.length:
                    raise CheckpointIntegrityError(
                        f"{rel}: reading back {_item_name(r.index)} found {got} of its {info.length} bytes right "
                        f"after writing them; the file system lost data, save again", _item_name(r.index), rel)
                table[str(info.offset)] = {"length": info.length, "crc32": crc, "tensor": _item_name(r.index)}
        with fs.create_stream(fs.concat_path(writer.path, rel + SUFFIX), "wb") as out:
            out.write(json.dumps({"algorithm": "crc32", "items": table}, sort_keys=True).encode())
        done += len(table)
    return done


def _side_file(reader: Any, rel: str, where: str) -> dict[str, Any]:
    fs = reader.fs
    try:
        with fs.create_stream(fs.concat_path(reader.path, rel + SUFFIX), "rb") as f:
            return json.loads(f.read())["items"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointIntegrityError(
            f"{where}: no readable checksums beside it ({rel + SUFFIX}: {type(e).__name__}: {e}); the checkpoint "
            f"was not saved by refimpl.torch_runtime.dcp or its side file is lost; load_into(..., verify=False) "
            f"loads it unverified", None, where) from e


def verify_plan(reader: Any, plan: Any) -> int:
    """Check every stored item ``plan`` (a DCP ``LoadPlan``) reads against its side file; returns how
    many items were checked. Raises :class:`CheckpointIntegrityError` at the first bad one."""
    by_file: dict[str, dict[int, tuple[Any, Any]]] = {}
    for req in plan.items:
        info = reader.storage_data[req.storage_index]
        by_file.setdefault(info.relative_path, {})[info.offset] = (req.storage_index, info)
    fs, checked = reader.fs, 0
    for rel, items in sorted(by_file.items()):
        where = str(fs.concat_path(reader.path, rel))
        table = _side_file(reader, rel, where)
        with fs.create_stream(fs.concat_path(reader.path, rel), "rb") as stream:
            for offset in sorted(items):
                index, info = items[offset]
                _check_item(stream, table.get(str(offset)), _item_name(index), info, where)
                checked += 1
    return checked


def _check_item(stream: Any, expected: dict[str, Any] | None, name: str, info: Any, where: str) -> None:
    if expected is None or expected.get("length") != info.length:
        raise CheckpointIntegrityError(
            f"{name} in {where}: the side file has no checksum for bytes {info.offset}..{info.offset + info.length} "
            f"(the data file or its metadata changed after the save); save the checkpoint again", name, where)
    crc, got = crc32_range(stream, info.offset, info.length)
    if got != info.length:
        raise CheckpointIntegrityError(
            f"{name} in {where}: the file is truncated ({got} of the item's {info.length} bytes at offset "
            f"{info.offset} are there); copy the checkpoint again or load an earlier one", name, where)
    if crc != expected["crc32"]:
        raise CheckpointIntegrityError(
            f"{name} in {where}: CRC-32 {crc:#010x} of its {info.length} bytes differs from {expected['crc32']:#010x} "
            f"written at save (flipped bits on disk or in transit); copy the checkpoint again or load an earlier "
            f"one", name, where)


def metadata_path(storage: Any, rank: int | None = None) -> Any:
    """The path of the checkpoint's metadata file in ``storage`` (a DCP writer or reader): the global one, or
    rank ``rank``'s own (DCP writes that one when a save runs without collectives)."""
    named = getattr(storage, "_get_metadata_path", None)
    if callable(named):
        return named(rank)
    return storage.fs.concat_path(storage.path, METADATA_NAME if rank is None else f"__{rank}{METADATA_NAME}")


def _written_metadata_path(writer: Any) -> Any:
    """Where the writer's ``finish`` put the metadata (rank-local when it saved without collectives)."""
    rank = getattr(writer, "rank", None)
    local = rank is not None and getattr(writer, "use_collectives", True) is False
    return metadata_path(writer, rank if local else None)


def write_metadata_checksum(writer: Any, path: Any = None) -> dict[str, Any]:
    """Read the metadata file ``path`` (default: the one the writer's ``finish`` wrote) and write its length and
    CRC-32 beside it (``<path>.crc32.json``); returns what was written."""
    fs = writer.fs
    path = _written_metadata_path(writer) if path is None else path
    with fs.create_stream(path, "rb") as stream:
        data = stream.read()
    entry = {"algorithm": "crc32", "length": len(data), "crc32": zlib.crc32(data)}
    with fs.create_stream(f"{path}{SUFFIX}", "wb") as out:
        out.write(json.dumps(entry, sort_keys=True).encode())
    return entry


def verify_metadata(reader: Any, rank: int | None = None) -> int:
    """Compare the metadata file DCP is about to unpickle with the length and CRC-32 written beside it at save;
    returns its length. Raises :class:`CheckpointIntegrityError` naming the file when the side file is missing
    or unreadable, or the file differs (a flipped bit, a truncated or replaced file)."""
    fs = reader.fs
    path = metadata_path(reader, rank)
    where = str(path)
    try:
        with fs.create_stream(f"{path}{SUFFIX}", "rb") as f:
            expected = json.loads(f.read())
        length, crc = int(expected["length"]), int(expected["crc32"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointIntegrityError(
            f"{where}: the checkpoint's metadata has no readable checksums beside it ({where}{SUFFIX}: "
            f"{type(e).__name__}: {e}); the checkpoint was not saved by refimpl.torch_runtime.dcp or its side file "
            f"is lost; load_into(..., verify=False) loads it unverified", None, where) from e
    with fs.create_stream(path, "rb") as stream:
        data = stream.read()
    if len(data) != length or zlib.crc32(data) != crc:
        raise CheckpointIntegrityError(
            f"{where}: the checkpoint's metadata (where each chunk sits in its tensor and its file) differs from "
            f"what was saved: {len(data)} bytes with CRC-32 {zlib.crc32(data):#010x}, saved {length} bytes with "
            f"{crc:#010x} (flipped bits on disk or in transit, or a replaced file); copy the checkpoint again or "
            f"load an earlier one", None, where)
    return length


@contextlib.contextmanager
def _rebound(obj: Any, method: str, replacement: Any) -> Iterator[None]:
    """``obj.<method>`` is ``replacement`` inside the block; whatever the instance had is put back after."""
    had = method in vars(obj)
    previous = vars(obj).get(method)
    setattr(obj, method, replacement)
    try:
        yield
    finally:
        if had:
            setattr(obj, method, previous)
        else:
            delattr(obj, method)


def checksummed(writer: Any) -> contextlib.AbstractContextManager:
    """Inside the block, ``writer.write_data`` also writes the side files of what it wrote and ``writer.finish``
    the metadata's (see the module docstring); a writer that is not file based saves without checksums (logged)."""
    if not file_based(writer):
        log.warning("checkpoint writer %s keeps no files this module can read back; saving without checksums "
                    "(load it with verify=False)", type(writer).__name__)
        return contextlib.nullcontext()
    original, original_finish = writer.write_data, writer.finish

    def write_data(plan: Any, planner: Any) -> Any:
        fut = original(plan, planner)
        results = fut.wait() if hasattr(fut, "wait") else fut.result()
        n = write_checksums(writer, results)
        log.debug("checkpoint %s: %d items summed", writer.path, n)
        return fut

    def finish(metadata: Any, results: Any) -> Any:
        out = original_finish(metadata, results)
        entry = write_metadata_checksum(writer)
        log.debug("checkpoint %s: metadata of %d bytes summed", writer.path, entry["length"])
        return out

    stack = contextlib.ExitStack()
    stack.enter_context(_rebound(writer, "write_data", write_data))
    stack.enter_context(_rebound(writer, "finish", finish))
    return stack


def verified(reader: Any) -> contextlib.AbstractContextManager:
    """Inside the block, ``reader.read_metadata`` first checks the metadata file and ``reader.read_data``
    every item its plan reads (see the module docstring). Raises :class:`CheckpointIntegrityError` at once
    for a reader that is not file based."""
    if not file_based(reader):
        raise CheckpointIntegrityError(
            f"checkpoint reader {type(reader).__name__} keeps no files to verify; use a FileSystemReader, or "
            f"load_into(..., verify=False) to load unverified")
    original, original_metadata = reader.read_data, reader.read_metadata

    def read_metadata(*args: Any, **kwargs: Any) -> Any:
        rank = kwargs.get("rank")
        if reader.fs.exists(metadata_path(reader, rank)):  # absent: DCP's own error, and its rank-local fallback
            try:
                verify_metadata(reader, rank)
            except CheckpointIntegrityError as e:
                raise CarriedError(e) from e
        return original_metadata(*args, **kwargs)

    def read_data(plan: Any, planner: Any) -> Any:
        n = verify_plan(reader, plan)
        log.debug("checkpoint %s: %d items verified", reader.path, n)
        return original(plan, planner)

    stack = contextlib.ExitStack()
    stack.enter_context(_rebound(reader, "read_metadata", read_metadata))
    stack.enter_context(_rebound(reader, "read_data", read_data))
    return stack


__all__ = ["METADATA_NAME", "SUFFIX", "checksummed", "crc32_range", "file_based", "metadata_path", "verified",
           "verify_metadata", "verify_plan", "write_checksums", "write_metadata_checksum"]
