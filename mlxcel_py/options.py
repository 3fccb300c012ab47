"""Frozen option objects: what the user asked for after parsing (CommandOptions, BenchOptions)
and what validation returns (RunConfig, BenchPlan).

Defaults live here once (DEFAULT_*), read by the Typer options, the HTTP server and the
validation layer alike. No typer, no mlx: this module and `validate` stay importable without MLX,
so `--help`, completion and flag checks are fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .formats.grammars import GrammarSpec

DEFAULT_MAX_TOKENS = -1  # -1: until EOS or the context window, like mlxcel
DEFAULT_TEMP = 0.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = 0
DEFAULT_MIN_P = 0.0
DEFAULT_REPETITION_PENALTY = 1.0
DEFAULT_REPEAT_LAST_N = -1  # -1: whole context, 0: off
# llama-server's (and mlxcel serve's) defaults, used by serve when neither a flag nor the model's
# generation_config.json says otherwise
SERVER_SAMPLING_DEFAULTS = {"temp": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05}

DEFAULT_NGRAM_MAX = 3
DEFAULT_NGRAM_MIN = 2
DEFAULT_MAX_DRAFT = 7
DEFAULT_POLICY = "auto"
NGRAM_MAX_LIMIT = 16
MAX_DRAFT_LIMIT = 64
DEFAULT_FULL_MODEL_BLOCK = 4
DEFAULT_SUFFIX_CACHE_TOKENS = 50_000
# --draft-acceptance: sampler-match (a model drafter draws with the target's own randomness at each
# position and a draft stands when it equals the target's draw: sampled output is plain decoding's,
# token for token, under a seed) or p-q (the drafter samples its own q, judged by min(1, p/q)
# (Leviathan/Chen): the same distribution, a few percent more accepted, other tokens than plain's)
DRAFT_ACCEPTANCE = ("sampler-match", "p-q")
# serve: verify rounds while at most this many requests are live (the seed's default), and only
# while they pay at the batch's measured cost (engine.gate); "auto" drops the count
DEFAULT_PROMPT_LOOKUP_MAX_BATCH = 2
# --draft-tree-budget: nodes a round's draft tree may add beside its chain; 0 verifies chains
# (engine/tree.py). Off by default: measured slower than chains here (docs/speculative-decoding.md)
DEFAULT_TREE_BUDGET = 0
# --draft-tree-margin: a model drafter adds a runner-up as a branch where its logit is within this of
# the step's best (inf: every runner-up; mlxcel's MLXCEL_MTP_TREE_MARGIN)
DEFAULT_TREE_MARGIN = float("inf")

POLICIES = ("auto", "graded", "gated", "cost")

# --cpu-weights: how linear layers hold their weights when MLX runs on the CPU (cpu/weights.py)
CPU_WEIGHTS = ("auto", "q8", "q4", "f32")
DEFAULT_CPU_WEIGHTS = "auto"
# --cache-type-k / --cache-type-v in llama.cpp's spelling; auto: f16 where the fused decoder layers
# run (models.decoder_layers), else f32. LATER_CACHE_TYPES: llama.cpp's other names, run as q8_0 with a note.
CACHE_TYPES = ("auto", "f32", "f16", "bf16", "q8_0", "q4_0")
LATER_CACHE_TYPES = ("q4_1", "iq4_nl", "q5_0", "q5_1")
# mlx-lm's --kv-bits / --kv-group-size, as aliases: 8 bits is q8_0 and 4 is q4_0 (blocks of 32
# values, as fine as mlx-lm's default group of 64 or finer)
KV_BITS = {8: "q8_0", 4: "q4_0"}
KV_GROUP_SIZES = (32, 64)

# serve -np: llama-server's automatic value (4 slots). Speculation is gated to 2 live requests
# (DEFAULT_PROMPT_LOOKUP_MAX_BATCH), so one or two users keep their speculative speed, and a
# batched step of 4 rows costs far less than 4 steps (README, Serving)
DEFAULT_PARALLEL = 4
# llama-server's reasoning_format: auto/deepseek split <think> into reasoning_content, none leaves the
# text whole, deepseek-legacy splits it and also keeps the tags in content
REASONING_FORMATS = ("auto", "deepseek", "deepseek-legacy", "none")
POOLINGS = ("none", "mean", "cls", "last")  # serve --pooling (engine/embeddings.py)
MAX_PARALLEL = 256
DEFAULT_CACHE_RAM_MIB = 8192  # llama-server's --cache-ram default
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


DEFAULT_MAX_PREDICT_MS = 300_000  # serve: no request decodes longer than 5 minutes unless --max-predict-ms says
MIN_TEMP = 1e-5  # temperatures below it decode greedily (SamplingOptions.greedy)
REPETITION_PENALTY_RANGE = (0.01, 100.0)  # beyond it logits overflow or vanish: refused


# serve --tools: llama-server's built-in agent tools, in its order (server/tools/builtin.py)
TOOL_NAMES = (
    "read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file", "get_info",
)  # fmt: skip
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")


@dataclass(frozen=True)
class ToolsRuntimeSpec:
    """Where built-in tools run, as --tools-runtime or the x-tool-runtime header names it:
    `docker:IMAGE`/`podman:IMAGE` (a container to start), `docker-container:ID`/
    `podman-container:ID` (a running one) or `ssh:TARGET`. A container id or ssh target that
    starts with '-' would be read as an option by the engine or by ssh (`-oProxyCommand=...`
    runs a command on this host), so `parse` refuses it, and any other scheme (ValueError)."""

    kind: str  # "image", "container" or "ssh"
    engine: str  # docker or podman ("" for ssh)
    target: str  # the image, container id or ssh target

    @staticmethod
    def parse(spec: str) -> ToolsRuntimeSpec:
        for engine in ("docker", "podman"):
            if spec.startswith(f"{engine}-container:"):
                cid = spec[len(engine) + len("-container:") :]
                if not _CONTAINER_ID.fullmatch(cid):
                    raise ValueError(f"invalid container id: {cid}")
                return ToolsRuntimeSpec("container", engine, cid)
            if spec.startswith(f"{engine}:"):
                image = spec[len(engine) + 1 :]
                if not image:
                    raise ValueError(f"{engine}:<image> requires an image name")
                return ToolsRuntimeSpec("image", engine, image)
        if spec.startswith("ssh:"):
            target = spec[len("ssh:") :]
            if not _SSH_TARGET.fullmatch(target):
                raise ValueError(f"invalid ssh target: {target}")
            return ToolsRuntimeSpec("ssh", "", target)
        raise ValueError(f"unknown tool runtime: {spec}")


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter as the command line names it: a path and the scale it is applied at."""

    path: str
    scale: float = 1.0
    flag: str = "--lora"  # the flag that named it, for messages

    @property
    def is_gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")


@dataclass(frozen=True)
class ModelOptions:
    model: str | None = None  # None: the embedded default model (or --hf-repo's)
    hf_repo: str | None = None  # llama.cpp's -hf OWNER/NAME[:QUANT] (models/hub.py fetches it at load)
    hf_file: str | None = None  # -hff: that file of the repo
    revision: str | None = None
    draft_model: str | None = None  # with draft_hf: the file of that repo (llama.cpp's -md beside -hfd)
    draft_hf: str | None = None  # llama.cpp's -hfd OWNER/NAME[:QUANT]: the drafter from the hub (session fetches it)
    blas: bool = True
    dequantize: bool = True
    fast_kernels: bool = True
    cpu_weights: str = DEFAULT_CPU_WEIGHTS  # one of CPU_WEIGHTS (bench: a comma list, see BenchPlan.weights)
    cache_type_k: str = "auto"  # one of CACHE_TYPES
    cache_type_v: str = "auto"
    kv_bits: int | None = None  # mlx-lm's --kv-bits (validate maps it onto the cache types)
    kv_group_size: int | None = None

    @property
    def cache_types(self) -> tuple[str, str]:
        return self.cache_type_k, self.cache_type_v

    chat_template: str | None = None  # --chat-template NAME|TEMPLATE as given (validate resolves it)
    chat_template_file: str | None = None  # --chat-template-file
    mmproj: str | None = None  # llama-server's --mmproj (refused: GGUF projectors are not converted)
    no_mmproj: bool = False  # --no-mmproj: a vision-language model loads as its text model only
    # --adapter-path (an mlx-lm folder), --lora / --lora-scaled (folders or GGUF LoRA files):
    # fused into the weights at load, in that order (their ids on serve's /lora-adapters)
    adapters: tuple[AdapterSpec, ...] = ()


@dataclass(frozen=True)
class SamplingOptions:
    temp: float = DEFAULT_TEMP
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, addition to its logit; -inf bans it)

    @property
    def greedy(self) -> bool:
        # below MIN_TEMP sampling is argmax in all but exact ties, and 1/temp would overflow
        # float32 logits into NaN (a temperature of 1e-300 sampled token 0 every step)
        return self.temp < MIN_TEMP


@dataclass(frozen=True)
class PromptOptions:
    """The prompt and what to make of it, as the command's flags give them (budget, stops,
    template, output reports, grammar); the API's one-call options are api.GenerateOptions."""

    prompt: str | None = None  # None: interactive chat; "-": read stdin
    max_tokens: int = DEFAULT_MAX_TOKENS
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    chat_template: bool = True
    system: str | None = None
    images: tuple[str, ...] = ()
    audio: tuple[str, ...] = ()
    video: tuple[str, ...] = ()
    profile: bool = False
    verbose: bool = False
    verify_exact: bool = False
    # constrained output, as given (validation reads the files and checks that it compiles)
    grammar: str | None = None
    grammar_file: str | None = None
    json_schema: str | None = None
    json_schema_file: str | None = None


@dataclass(frozen=True)
class PromptLookupOptions:
    """As parsed: None means the flag was not given (so "requires --prompt-lookup" can be checked)."""

    enabled: bool = False
    ngram_max: int | None = None
    ngram_min: int | None = None
    max_draft: int | None = None
    no_adaptive: bool = False
    policy: str | None = None


@dataclass(frozen=True)
class SpecOptions:
    draft_kind: str | None = None
    draft_block_size: int | None = None
    draft_min: int | None = None  # --draft-min: drafts shorter than this are not verified
    draft_acceptance: str | None = None  # --draft-acceptance: one of DRAFT_ACCEPTANCE
    spec_type: str | None = None
    lookup: PromptLookupOptions = field(default_factory=PromptLookupOptions)
    suffix_cache_tokens: int | None = None
    suffix_store: str | None = None
    tree_budget: int | None = None  # --draft-tree-budget
    tree_margin: float | None = None  # --draft-tree-margin
    # mlxcel's MTP tree settings as given in its environment variables (text: read on mtp only)
    mtp_tree_branches: str | None = None  # MLXCEL_MTP_TREE_BRANCHES
    mtp_tree_margin: str | None = None  # MLXCEL_MTP_TREE_MARGIN


@dataclass(frozen=True)
class ParallelOptions:
    """--tp-size / --pp-size: one model across this many processes (distributed.py)."""

    tp_size: int = 1
    pp_size: int = 1

    @property
    def size(self) -> int:
        """The world it needs (a 2-D layout is refused, so one of the two is 1)."""
        return self.tp_size * self.pp_size

    @property
    def active(self) -> bool:
        return self.size > 1

    @property
    def flag(self) -> str:
        return f"--tp-size {self.tp_size}" if self.tp_size > 1 else f"--pp-size {self.pp_size}"

    def describe(self) -> str:
        return f"tensor parallel x{self.tp_size}" if self.tp_size > 1 else f"pipeline parallel x{self.pp_size}"


@dataclass(frozen=True)
class ServerOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    prompt_lookup_max_batch: int | None = DEFAULT_PROMPT_LOOKUP_MAX_BATCH  # None (auto): the measured cost alone
    no_batch: bool = False
    kv_unified: bool = False
    warmup: bool = True
    api_keys: tuple[str, ...] = ()  # as given: repeated flags, each possibly comma-separated
    api_key_file: str | None = None
    cors_origins: str | None = None  # as given; None: llama-server's default (every origin reflected)
    cors_methods: str | None = None
    cors_headers: str | None = None
    cors_credentials: bool = True
    slots: bool = True  # GET /slots (--no-slots: 501, as llama-server)
    metrics: bool = False  # GET /metrics answers (501 without --metrics, as llama-server and mlxcel)
    reasoning_format: str = "auto"  # a request's default reasoning_format (REASONING_FORMATS)
    reasoning: str = "auto"  # --reasoning: on / off tell templates enable_thinking; auto leaves it
    reasoning_budget: int = -1  # --reasoning-budget: -1 unlimited, 0 no thinking (as --reasoning off)
    chat_template_kwargs: str | None = None  # --chat-template-kwargs: a JSON object, as given
    verbose: bool = False  # -v: chat replies carry llama-server's `__verbose` (the rendered prompt)
    alias: str | None = None  # comma-separated names (llama-server's --alias)
    tags: str | None = None  # comma-separated, informational (llama-server's --tags)
    threads: int | None = None
    ctx_size: int = 0  # 0: the model's context window
    context_shift: bool = False  # --context-shift: a full window drops part of the context and goes on
    keep: int = 0  # --keep: tokens of the prompt a shift keeps (-1: all of it)
    embeddings: bool = False  # --embeddings: /v1/embeddings and /embedding answer (501 without)
    pooling: str = "last"  # --pooling: none, mean, cls or last (engine/embeddings.py)
    reranking: bool = False  # --reranking (or --pooling rank): /rerank scores documents (engine/rerank.py)
    image_url_fetch: bool = False  # --image-url-fetch: http(s) image URLs in requests are downloaded
    image_url_allow: tuple[str, ...] = ()  # --image-url-allow: hosts fetched though not public addresses
    media_path: str | None = None  # --media-path: file:// image URLs name files inside this folder
    slot_save_path: str | None = None  # --slot-save-path: the folder of slot files (POST /slots/{id})
    cache_ram: int = DEFAULT_CACHE_RAM_MIB  # finished requests' caches kept, MiB; -1 no limit, 0 off
    parallel: int = DEFAULT_PARALLEL
    parallel_given: bool = False  # -np given: the window is split across the slots unless -kvu
    log_disable: bool = False
    webui: bool = True  # the chat page at / (--no-webui: / is a 404, as llama-server's)
    models_dir: str | None = None  # --models-dir: router mode, one server per model found there
    models_max: int = 4  # --models-max: models loaded at once in router mode (0: no limit)
    models_preset: str | None = None  # --models-preset: an INI file of models and their flags (router mode)
    models_autoload: bool = True  # --no-models-autoload: a model loads only by POST /models/load
    mcp_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy forwards to public URLs (server/cors_proxy.py)
    mcp_proxy_allow: tuple[str, ...] = ()  # --ui-mcp-proxy-allow: hosts it may reach beyond that policy
    tools: tuple[str, ...] = ()  # --tools: the built-in agent tools served at /tools ("all": every one)
    tools_runtime: str | None = None  # --tools-runtime: the container or ssh host they run in (None: here)
    mcp_servers_config: str | None = None  # --mcp-servers-config: a JSON file of MCP servers whose tools /tools lists
    mcp_servers_json: str | None = None  # --mcp-servers-json: the same, inline
    shutdown_grace: int = 5  # seconds requests in flight get after SIGTERM before they are cancelled
    sleep_idle_seconds: int = -1  # --sleep-idle-seconds: release the model after this long idle (-1: never)
    max_predict_ms: int = DEFAULT_MAX_PREDICT_MS  # a request's decoding time limit (0: none)
    sampling_given: tuple[str, ...] = ()  # sampling flags given on the command line (the rest: model/server defaults)
    ignored: tuple[str, ...] = ()  # llama-server flags given that do not apply here (GPU offload...)

    @property
    def router(self) -> bool:
        """Router mode: models from a folder or a preset file, each in a server of its own."""
        return self.models_dir is not None or self.models_preset is not None

    @property
    def split_context(self) -> bool:
        """llama-server's rule: an explicit `-np N` gives each slot `-c / N` tokens; the default
        slot count and `-kvu` give every slot the whole window."""
        return self.parallel_given and self.parallel > 1 and not self.kv_unified

    def slot_context(self, window: int) -> int:
        return max(window // self.parallel, 1) if self.split_context else window


@dataclass(frozen=True)
class CommandOptions:
    """Everything one command invocation asked for."""

    command: str  # generate | run | chat | serve | bench
    model: ModelOptions = field(default_factory=ModelOptions)
    generation: PromptOptions = field(default_factory=PromptOptions)
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    spec: SpecOptions = field(default_factory=SpecOptions)
    server: ServerOptions = field(default_factory=ServerOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)


# ---- validated, resolved configuration handed to loading and the engine ----


@dataclass(frozen=True)
class LookupConfig:
    ngram_min: int = DEFAULT_NGRAM_MIN
    ngram_max: int = DEFAULT_NGRAM_MAX
    max_draft: int = DEFAULT_MAX_DRAFT
    adaptive: bool = True
    policy: str = DEFAULT_POLICY


@dataclass(frozen=True)
class DraftConfig:
    """The drafter a command runs with, or kind=None for plain decoding."""

    kind: str | None = None  # None (plain decoding) or a drafters.registry kind
    lookup: LookupConfig = field(default_factory=LookupConfig)
    draft_model: str | None = None  # full-model: the drafter; mtp: a separate head checkpoint (optional)
    # -hfd OWNER/NAME[:QUANT]: draft_model is fetched from this repo at load (session.py); until
    # then draft_model holds the spec, and draft_hub_file the file -md named in that repo
    draft_hub: str | None = None
    draft_hub_file: str | None = None
    block_size: int = DEFAULT_FULL_MODEL_BLOCK
    block_explicit: bool = False  # --draft-block-size given (else an MTP checkpoint's own width wins)
    kind_explicit: bool = False  # --draft-kind given (else an MTP checkpoint as --draft-model means mtp)
    suffix_cache_tokens: int = DEFAULT_SUFFIX_CACHE_TOKENS  # suffix: the store's token budget
    suffix_store: str | None = None  # suffix: the file the store is loaded from and saved to
    tree_budget: int = (
        DEFAULT_TREE_BUDGET  # branch nodes a round may verify beside its chain (engine/tree.py); 0: chains
    )
    tree_margin: float = DEFAULT_TREE_MARGIN  # model drafters: branch to tokens this close to the best logit
    # llama-server's --draft-min: a round whose draft is shorter than this decodes plainly instead
    min_draft: int = 0
    # how a sampled round judges a model drafter's draft (DRAFT_ACCEPTANCE; drafters/base.draw)
    acceptance: str = "sampler-match"
    # generate --prompt-lookup --draft-model: prompt lookup where the context has a match, this
    # model drafter elsewhere, in one round loop (drafters/composite.py); `lookup` configures it
    lookup_first: bool = False

    @property
    def enabled(self) -> bool:
        return self.kind is not None


@dataclass(frozen=True)
class RunConfig:
    """The validated result of one command's options."""

    options: CommandOptions
    draft: DraftConfig
    warnings: tuple[str, ...] = ()  # accepted, but worth a line on stderr (e.g. a dropped drafter)
    grammar: GrammarSpec | None = None  # the output is constrained to it (generate, run)
    chat_template: str | None = None  # the template text that replaces the model's own


# ---- mlxcel bench ----

DEFAULT_BENCH_MAX_TOKENS = 128
PEERS = ("mlx-lm", "llama.cpp")
MAX_BUSY = 64  # bench --busy


@dataclass(frozen=True)
class BenchOptions:
    """`mlxcel bench`'s own flags, as parsed (the model side is in CommandOptions)."""

    workload: str | None = None  # None: the built-in set
    sweep_widths: str | None = None  # "1,2,4,7,12"
    vs: str | None = None  # one of PEERS
    json_path: str | None = None
    markdown: bool = False
    plot_path: str | None = None
    limit: int | None = None  # prompts per kind
    repeats: int = 1
    busy: int = 0  # background busy loops (nice 19) during the run
    trace: str | None = (
        None  # multi-turn traces (JSON Lines of {"turns": [...]}) instead of a workload  # timed runs per prompt and configuration (the median-speed one is kept)
    )
    tree_budgets: str | None = None  # --draft-tree-budget as a comma list: each benchmarked


@dataclass(frozen=True)
class BenchPlan:
    """A validated benchmark: the drafters to compare, the widths to run each at, the outputs."""

    run: RunConfig  # what open_session loads (the full-model drafter when one is asked for)
    drafts: tuple[DraftConfig, ...]  # one per (drafter, width), in run order
    widths: tuple[int, ...]  # the sweep, or () for each drafter's configured width
    bench: BenchOptions
    weights: tuple[str, ...] = (DEFAULT_CPU_WEIGHTS,)  # --cpu-weights modes, each benchmarked (first: the session's)


_HUB_REPO = re.compile(r"^[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*$")


def valid_hub_repo(repo: str) -> bool:
    """llama.cpp's rule for a Hugging Face repo id: one `/`, and `.`/`-` only between letters,
    digits or `_` (so no `..`, no leading dash)."""
    return len(repo) <= 256 and _HUB_REPO.match(repo) is not None


def split_hub_spec(spec: str) -> tuple[str, str]:
    """`OWNER/NAME[:QUANT]` (-hf, POST /models, presets' hf-repo) -> (repo, upper-case quant or '');
    ValueError when it is malformed."""
    repo, _, tag = spec.partition(":")
    if not valid_hub_repo(repo) or (tag and not re.fullmatch(r"[A-Za-z0-9_]+", tag)):
        raise ValueError(f"{spec[:200]!r} is not a Hugging Face repo: OWNER/NAME[:QUANT]")
    return repo, tag.upper()
