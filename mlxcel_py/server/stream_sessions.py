"""Resumable streams, llama-server's (its server-stream.cpp): a streamed request that carries an
`X-Conversation-Id` header keeps generating when its client leaves (a page reload, a dropped
network), and its bytes can be read again.

- The stream's frames go into a session of that id (a new request with the same id replaces the
  old session and stops its generation); the client reads the session as it fills, so what it gets
  is exactly what it would have got directly. Its leaving ends only its own reading.
- `GET /v1/stream?conv_id=ID&from=N` reads the session from byte N: what is buffered, then the
  rest live, until the generation ends. 404 for an unknown or expired id; 400 for an offset that
  is no number or that fell out of the buffer.
- `DELETE /v1/stream?conv_id=ID` is the user's Stop: the generation is cancelled and the session
  dropped; 204 whether or not it was there.
- `POST /v1/streams/lookup {"conversation_ids": [...]}` lists the sessions of those ids (and of
  `ID::MODEL`, the web UI's per-model ids): `conversation_id`, `is_done`, `total_bytes`,
  `started_at`, `completed_at` (unix seconds, 0 while running).

Limits (llama-server's): a session keeps its last 4 MiB, and is dropped 300 s after its
generation ends. At most MAX_SESSIONS live at once: the oldest ended one goes first, else the
oldest (its generation goes on; it just cannot be resumed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

MAX_BYTES = 4 * 1024 * 1024
TTL_SECONDS = 300.0
MAX_SESSIONS = 1024
HEADER = "x-conversation-id"


class OffsetLost(Exception):
    pass


class Session:
    def __init__(self, conv_id: str):
        self.conv_id = conv_id
        self.started = int(time.time())
        self.completed = 0  # unix seconds once the generation has ended
        self.buffer = bytearray()
        self.dropped = 0  # bytes gone from the front (over MAX_BYTES)
        self.done = False
        self.producer: asyncio.Task | None = None
        self._wake = asyncio.Event()

    @property
    def total(self) -> int:
        return self.dropped + len(self.buffer)

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self.buffer += data
        over = len(self.buffer) - MAX_BYTES
        if over > 0:
            del self.buffer[:over]
            self.dropped += over
        self._notify()

    def finish(self) -> None:
        if not self.done:
            self.done, self.completed = True, int(time.time())
            self._notify()

    def cancel(self) -> None:
        """The user's Stop: the generation ends (its jobs are cancelled as the stream closes)."""
        if self.producer is not None and not self.producer.done():
            self.producer.cancel()
        self.finish()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def read(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset` on, as they arrive, until the generation has ended."""
        while True:
            if offset < self.dropped:
                raise OffsetLost
            end = self.total
            if offset < end:
                chunk = bytes(self.buffer[offset - self.dropped :])
                offset = end
                yield chunk
                continue
            if self.done:
                return
            await self._wake.wait()


class Sessions:
    def __init__(self):
        self.by_id: dict[str, Session] = {}

    def _expire(self) -> None:
        cutoff = time.time() - TTL_SECONDS
        for conv_id, s in list(self.by_id.items()):
            if s.done and s.completed <= cutoff:
                del self.by_id[conv_id]

    def get(self, conv_id: str) -> Session | None:
        self._expire()
        return self.by_id.get(conv_id)

    def start(self, conv_id: str, frames: AsyncIterator[str]) -> Session:
        """A session for `conv_id` filled from `frames` by a task of its own (any earlier session
        of the id is stopped)."""
        self._expire()
        old = self.by_id.pop(conv_id, None)
        if old is not None:
            old.cancel()
        while len(self.by_id) >= MAX_SESSIONS:
            ended = [s for s in self.by_id.values() if s.done]
            victim = min(ended or self.by_id.values(), key=lambda s: (s.completed, s.started))
            del self.by_id[victim.conv_id]
        session = self.by_id[conv_id] = Session(conv_id)

        async def produce() -> None:
            try:
                async for text in frames:
                    session.append(text.encode())
            finally:
                await frames.aclose()  # cancelled by a Stop: the jobs end with the stream
                session.finish()

        session.producer = asyncio.ensure_future(produce())
        return session

    def stop(self, conv_id: str) -> None:
        session = self.by_id.pop(conv_id, None)
        if session is not None:
            session.cancel()

    def lookup(self, ids: list[str]) -> list[dict]:
        self._expire()
        out = []
        for rid in ids:
            for s in list(self.by_id.values()):
                if s.conv_id == rid or s.conv_id.startswith(rid + "::"):
                    out.append(
                        {
                            "conversation_id": s.conv_id,
                            "is_done": s.done,
                            "total_bytes": s.total,
                            "started_at": s.started,
                            "completed_at": s.completed,
                        }
                    )
        return out

    def shutdown(self) -> None:
        for s in list(self.by_id.values()):
            s.finish()
        self.by_id.clear()
