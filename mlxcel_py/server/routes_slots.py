"""llama-server's slot actions: `POST /slots/{id}?action=save|restore|erase` under
`--slot-save-path DIR` (501 without it, as llama-server answers). slot_files.py says what each
does with the shared prompt cache; the work runs on the model's thread (Worker.call)."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import APIRouter, Request

from . import slot_files
from .context import ctx_of
from .http import ApiError, read_json

router = APIRouter()


@router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str, action: str = ""):
    folder: Path | None = getattr(request.app.state, "slot_dir", None)
    if folder is None:
        raise ApiError(
            "This server does not support slots action. Start it with `--slot-save-path`",
            status=501,
            type="not_supported_error",
        )
    ctx = ctx_of(request)
    try:
        slot = int(id_slot)
    except ValueError:
        raise ApiError("Invalid slot ID") from None
    if not 0 <= slot < ctx.worker.parallel:
        raise ApiError("Invalid slot ID")
    engine, t0 = ctx.engine, time.perf_counter()
    if action == "erase":
        erased = await ctx.worker.call(lambda: slot_files.erase(engine))
        return {"id_slot": slot, "n_erased": erased}
    if action not in ("save", "restore"):
        raise ApiError("Invalid action")
    name = slot_files.check_filename((await read_json(request, ctx.body_limit)).get("filename"))
    path = folder / name
    if action == "save":
        n, size = await ctx.worker.call(lambda: slot_files.save(engine, path))
        ms = (time.perf_counter() - t0) * 1000
        return {"id_slot": slot, "filename": name, "n_saved": n, "n_written": size, "timings": {"save_ms": ms}}
    n, size = await ctx.worker.call(lambda: slot_files.restore(engine, path))
    ms = (time.perf_counter() - t0) * 1000
    return {"id_slot": slot, "filename": name, "n_restored": n, "n_read": size, "timings": {"restore_ms": ms}}
