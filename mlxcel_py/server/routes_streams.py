"""llama-server's resumable-stream routes (stream_sessions.py): `GET /v1/stream` reads a session
again from a byte offset, `DELETE /v1/stream` stops one, `POST /v1/streams/lookup` lists those of
known ids. They answer while the model loads or sleeps: the sessions are the app's, not the model's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from .http import ApiError, read_json
from .stream_sessions import OffsetLost, Session, Sessions

router = APIRouter()


def sessions_of(request: Request) -> Sessions:
    return request.app.state.streams


def _conv_id(request: Request) -> str:
    conv_id = request.query_params.get("conv_id", "")
    if not conv_id:
        raise ApiError("Missing conversation id in path")
    return conv_id


def replay(session: Session, offset: int) -> StreamingResponse:
    """The session from `offset`, as server-sent events (its frames as they were sent)."""
    if offset < session.dropped:
        raise ApiError("Stream offset lost, please restart")

    async def body():
        try:
            async for chunk in session.read(offset):
                yield chunk
        except OffsetLost:  # the buffer moved past the reader (over 4 MiB behind): it stops there
            return

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.get("/v1/stream")
async def read_stream(request: Request):
    conv_id = _conv_id(request)
    raw = request.query_params.get("from", "0") or "0"
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError("Invalid 'from' offset")
    session = sessions_of(request).get(conv_id)
    if session is None:
        raise ApiError("Stream not found or expired", status=404, type="not_found_error")
    return replay(session, int(raw))


@router.delete("/v1/stream")
async def stop_stream(request: Request):
    sessions_of(request).stop(_conv_id(request))
    return Response(status_code=204)


@router.post("/v1/streams/lookup")
async def lookup_streams(request: Request):
    body = await read_json(request, request.app.state.body_limit)
    ids = body.get("conversation_ids")
    wanted = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
    return sessions_of(request).lookup(wanted[:1000])
