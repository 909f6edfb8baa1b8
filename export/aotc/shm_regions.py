"""Triton's system shared memory extension for `aotc serve --python`: POSIX shared memory objects a client
created and registered by name; inputs are read from them and outputs written into them instead of travelling
in the HTTP body (the C++ server's runtime_cpp/server/shared_memory.h, with the same answers).

Each region maps its whole object (/dev/shm/<key>, Linux). Reads and writes copy, so unregistering a region
never leaves a view into unmapped memory. Thread-safe: one lock around the table.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

from aotc_client.errors import RequestError

OFF = "system shared memory is off; start the server with --allow-shared-memory to use it"


@dataclass
class _Region:
    key: str
    offset: int
    byte_size: int
    mem: mmap.mmap


class SharedMemoryRegions:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._lock = threading.Lock()
        self._regions: dict[str, _Region] = {}

    def _check(self) -> None:
        if not self.enabled:
            raise RequestError(OFF, 403)

    def register(self, name: str, body) -> None:
        self._check()
        what = f"shared memory region '{name}'"
        if not isinstance(body, dict) or not isinstance(body.get("key"), str) or not body["key"]:
            raise RequestError(f"registration of {what}: missing string field 'key'")
        key, offset, size = body["key"], body.get("offset", 0), body.get("byte_size")
        for field, v in (("offset", offset), ("byte_size", size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise RequestError(f"registration of {what}: '{field}' must be a non-negative integer")
        if size == 0:
            raise RequestError(f"{what}: 'byte_size' must be at least 1")
        with self._lock:
            if name in self._regions:
                raise RequestError(f"{what} is already registered; unregister it first")
        path = "/dev/shm/" + key.lstrip("/")
        if "/" in key.lstrip("/"):
            raise RequestError(f"{what}: cannot open shared memory object '{key}': Invalid argument")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise RequestError(f"{what}: cannot open shared memory object '{key}': {e.strerror}") from None
        try:
            total = os.fstat(fd).st_size
            if total < offset or total - offset < size:
                raise RequestError(f"{what}: offset {offset} + byte_size {size} exceeds the {total} bytes of "
                                   f"object '{key}'")
            mem = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        with self._lock:
            if name in self._regions:
                mem.close()
                raise RequestError(f"{what} is already registered; unregister it first")
            self._regions[name] = _Region(key, offset, size, mem)

    def unregister(self, name: str = "") -> None:
        self._check()
        with self._lock:
            gone = list(self._regions) if not name else [name] if name in self._regions else []
            for n in gone:
                self._regions.pop(n).mem.close()

    def status(self, name: str = "") -> list[dict]:
        self._check()
        with self._lock:
            if name and name not in self._regions:
                raise RequestError(f"no shared memory region '{name}' is registered", 404)
            return [{"name": n, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                    for n, r in self._regions.items() if not name or n == name]

    def _locate(self, ref: tuple[str, int, int], what: str) -> tuple[_Region, int]:
        region, offset, size = ref
        self._check()
        r = self._regions.get(region)
        if r is None:
            raise RequestError(f"{what}: no shared memory region '{region}' is registered")
        if offset > r.byte_size or size > r.byte_size - offset:
            raise RequestError(f"{what}: shared_memory_offset {offset} + shared_memory_byte_size {size} exceeds "
                               f"region '{region}' ({r.byte_size} bytes)")
        return r, r.offset + offset

    def read(self, ref: tuple[str, int, int], what: str) -> bytes:
        """The bytes `ref` = (region, offset, byte_size) names, copied out."""
        with self._lock:
            r, start = self._locate(ref, what)
            return r.mem[start:start + ref[2]]

    def write(self, ref: tuple[str, int, int], data: bytes, what: str) -> None:
        """Writes `data` at `ref`; RequestError when it is larger than ref's byte_size."""
        with self._lock:
            r, start = self._locate(ref, what)
            r.mem[start:start + len(data)] = data
