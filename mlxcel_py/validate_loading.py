"""Validation of the flags that decide what loads and for how long: -hf/--hf-repo, --adapter-path / --lora /
--lora-scaled (adapters fused into the model), serve's --sleep-idle-seconds (release the model when idle)
and router mode (--models-dir, --models-max). Called by validate before anything loads
(docs/validation.md)."""

from __future__ import annotations

import math
from pathlib import Path

from .errors import UsageError
from .options import CommandOptions, split_hub_spec

ADAPTER_FILES = ("adapter_config.json", "adapters.safetensors")


def hub_model(opts: CommandOptions) -> None:
    """-hf/--hf-repo OWNER/NAME[:QUANT] (and -hff): well formed, and the only name of the model;
    -hfd (the drafter's repo) well formed."""
    m = opts.model
    if m.draft_hf is not None:
        try:
            split_hub_spec(m.draft_hf)
        except ValueError as exc:
            raise UsageError(f"--spec-draft-hf: {exc}") from None
    if m.hf_file is not None and m.hf_repo is None:
        raise UsageError(f"--hf-file {m.hf_file}: names a file of --hf-repo's repo; give --hf-repo too")
    if m.hf_repo is None:
        return
    try:
        split_hub_spec(m.hf_repo)
    except ValueError as exc:
        raise UsageError(f"--hf-repo: {exc}") from None
    if m.model is not None:
        raise UsageError(f"-m {m.model} and --hf-repo {m.hf_repo} both name the model; give one")
    if m.revision is not None:
        raise UsageError("--revision applies to -m OWNER/NAME; --hf-repo reads the repo's main revision")


def adapter(opts: CommandOptions) -> None:
    """--adapter-path / --lora / --lora-scaled: mlx-lm adapter folders or GGUF LoRA files, on one process."""
    for spec in opts.model.adapters:
        flag = f"{spec.flag} {spec.path}"
        if not math.isfinite(spec.scale):
            raise UsageError(f"{flag}: expected FNAME:SCALE, a path and a number after its last colon")
        p = Path(spec.path)
        if spec.is_gguf:
            if not p.is_file():
                raise UsageError(f"{flag}: no such file")
        elif not p.is_dir():
            raise UsageError(
                f"{flag}: no such folder or .gguf file; give the folder mlx_lm.lora wrote or a GGUF LoRA adapter"
            )
        elif missing := [f for f in ADAPTER_FILES if not (p / f).is_file()]:
            raise UsageError(f"{flag}: no {' or '.join(missing)} in it; give the folder mlx_lm.lora wrote")
        if opts.parallel.active:
            raise UsageError(f"{flag}: adapters are not fused on {opts.parallel.flag} ranks; drop one of them")


def serving(opts: CommandOptions) -> None:
    """serve's flags for how long and how many models stay loaded."""
    _sleep(opts)
    _router(opts)


def _sleep(opts: CommandOptions) -> None:
    srv = opts.server
    if srv.sleep_idle_seconds == 0 or srv.sleep_idle_seconds < -1:
        raise UsageError(f"--sleep-idle-seconds must be -1 (never) or 1 or more seconds, got {srv.sleep_idle_seconds}")
    if srv.sleep_idle_seconds > 0 and opts.parallel.active:
        raise UsageError(
            f"--sleep-idle-seconds does not run under {opts.parallel.flag}: every rank holds its part of the model; "
            "drop one of them"
        )


def _router(opts: CommandOptions) -> None:
    """--models-dir (router mode) against what names one model or splits one (the folder's
    existence is checked with the other folders, in validate)."""
    srv = opts.server
    if srv.models_max < 0:
        raise UsageError(f"--models-max must be 0 (no limit) or more, got {srv.models_max}")
    if not srv.router:
        return
    flag = "--models-dir" if srv.models_dir is not None else "--models-preset"
    if srv.models_preset is not None and not Path(srv.models_preset).is_file():
        raise UsageError(f"--models-preset {srv.models_preset}: no such file")
    if opts.model.model is not None or opts.model.hf_repo is not None:
        raise UsageError(f"{flag} runs a router that starts one server per model found there; drop -m/--model/-hf")
    if opts.parallel.active:
        raise UsageError(f"{flag} does not run under {opts.parallel.flag}; drop one of them")
