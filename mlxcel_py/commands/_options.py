"""Every command-line option, defined once as an Annotated alias, and the mapping to options.py.

Commands declare parameters with these aliases and hand their values to `build_options`, which
returns the frozen CommandOptions the validation layer checks. Defaults come from options.py.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import replace
from typing import Annotated, Any, Optional

import typer

from .. import options as O
from ..drafters import registry

MODEL = "Model"
GEN = "Generation"
SAMPLING = "Sampling"
SPEC = "Speculative decoding"
LOOKUP = "Prompt lookup"
SERVER = "Server"
DISTRIBUTED = "Distributed (one model across processes)"
RUNTIME = "Runtime (Linux CPU fast path)"

# one option a line: the table reads as the --help it makes
# fmt: off
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Model: an mlx-lm folder, a .gguf file, or an owner/name repo id. Default: the embedded SmolLM2-135M-Instruct.", rich_help_panel=MODEL)]
ModelArg = Annotated[Optional[str], typer.Argument(metavar="[MODEL]", help="Model folder, .gguf file or owner/name (default: the embedded SmolLM2-135M-Instruct).", show_default=False)]
HfRepoOpt = Annotated[Optional[str], typer.Option("--hf-repo", "-hf", "-hfr", metavar="OWNER/NAME[:QUANT]", help="Model from the Hugging Face hub, llama.cpp's way: a GGUF repo's QUANT file (default Q4_K_M, then Q8_0, then the first), or an mlx-lm repo; from the cache, else downloaded. On serve, a repo holding a preset.ini runs a router over it.", rich_help_panel=MODEL)]
HfFileOpt = Annotated[Optional[str], typer.Option("--hf-file", "-hff", metavar="FILE", help="With --hf-repo: this file of the repo instead of the QUANT's.", rich_help_panel=MODEL)]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hugging Face revision (repo ids only).", rich_help_panel=MODEL)]
DraftModelOpt = Annotated[Optional[str], typer.Option("--draft-model", "--model-draft", "--spec-draft-model", "-md", help="Smaller causal LM sharing the target's tokenizer, used as a full-model drafter.", rich_help_panel=MODEL)]
DraftHfOpt = Annotated[Optional[str], typer.Option("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft", metavar="OWNER/NAME[:QUANT]", help="The drafter from the Hugging Face hub, as --hf-repo fetches a model (llama-server's); -md then names a file of that repo.", rich_help_panel=MODEL)]
MmprojOpt = Annotated[Optional[str], typer.Option("--mmproj", "-mm", metavar="FILE", help="llama.cpp's vision projector GGUF beside a .gguf model (SmolVLM / Idefics3 projectors are converted).", rich_help_panel=MODEL)]
AdapterOpt = Annotated[Optional[str], typer.Option("--adapter-path", metavar="DIR", help="A LoRA, DoRA or full fine-tune adapter folder from mlx_lm.lora (adapter_config.json, adapters.safetensors), fused into the weights at load as mlx_lm.fuse does (mlx-lm's name).", rich_help_panel=MODEL)]
LoraOpt = Annotated[Optional[list[str]], typer.Option("--lora", metavar="FNAME", help="A LoRA adapter at scale 1: a GGUF file from llama.cpp's convert_lora_to_gguf.py or an mlx_lm.lora folder; repeat it or separate several with commas (llama-server's). Adapters are fused into the weights at load.", rich_help_panel=MODEL)]
LoraScaledOpt = Annotated[Optional[list[str]], typer.Option("--lora-scaled", metavar="FNAME:SCALE", help="A LoRA adapter at its own scale, FNAME:SCALE; repeat it or separate several with commas (llama-server's).", rich_help_panel=MODEL)]
NoMmprojOpt = Annotated[bool, typer.Option("--no-mmproj", help="Load a vision-language model as its text model only (llama-server's).", rich_help_panel=MODEL)]
NoBlasOpt = Annotated[bool, typer.Option("--no-blas", help="Keep MLX's bundled reference BLAS instead of loading OpenBLAS (Linux CPU).", rich_help_panel=RUNTIME)]
NoDequantizeOpt = Annotated[bool, typer.Option("--no-dequantize", help="Keep quantized weights on the CPU instead of dequantizing to float32.", rich_help_panel=RUNTIME)]
CpuWeightsOpt = Annotated[Optional[str], typer.Option("--cpu-weights", metavar="auto|q8|q4|f32", help="CPU weight form: the row-exact kernels with 8- or 4-bit weights, or float32 on BLAS; auto: the kernels where they built, each layer as stored (quantized layers keep their bits, float16/bfloat16/float32 layers their precision on the float kernel), else f32. bench: a comma list, each benchmarked.", rich_help_panel=RUNTIME)]
CacheTypeKOpt = Annotated[Optional[str], typer.Option("--cache-type-k", "-ctk", metavar="auto|f32|f16|bf16|q8_0|q4_0", help="KV cache type for keys (llama.cpp's spelling): auto is f16 where the fused decoder layers run, else f32; q8_0 and q4_0 are 8- and 4-bit blocks of 32. A row is rounded once, when written, so speculative output still equals plain output at the same type.", rich_help_panel=RUNTIME)]
CacheTypeVOpt = Annotated[Optional[str], typer.Option("--cache-type-v", "-ctv", metavar="auto|f32|f16|bf16|q8_0|q4_0", help="KV cache type for values (as --cache-type-k).", rich_help_panel=RUNTIME)]
KvBitsOpt = Annotated[Optional[int], typer.Option("--kv-bits", metavar="8|4", help="mlx-lm's spelling: 8 is --cache-type-k q8_0 --cache-type-v q8_0, 4 is q4_0.", rich_help_panel=RUNTIME)]
KvGroupSizeOpt = Annotated[Optional[int], typer.Option("--kv-group-size", metavar="32|64", help="mlx-lm's, with --kv-bits: the blocks are 32 values (as fine as 64 or finer).", rich_help_panel=RUNTIME)]
NoFastKernelsOpt = Annotated[bool, typer.Option("--no-fast-kernels", help="Keep mlx-lm's attention and SwiGLU (MLX's scalar exp on the CPU) instead of the vectorized-exp kernels.", rich_help_panel=RUNTIME)]

PromptOpt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text; '-' reads it from stdin. Without it: interactive chat.", rich_help_panel=GEN)]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", metavar="N", help="Most tokens to generate; -1: until EOS or the context window.", rich_help_panel=GEN)]
BenchMaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", metavar="N", help=f"Most tokens per prompt and configuration (at least 1; default {O.DEFAULT_BENCH_MAX_TOKENS}).", rich_help_panel=GEN)]
MinTokensOpt = Annotated[int, typer.Option("--min-tokens", metavar="N", help="Suppress EOS until this many tokens were generated.", rich_help_panel=GEN)]
ProfileOpt = Annotated[bool, typer.Option("--profile", help="Print a timing breakdown on stderr.", rich_help_panel=GEN)]
NoChatTemplateOpt = Annotated[bool, typer.Option("--no-chat-template", help="Feed the raw prompt (no chat template).", rich_help_panel=GEN)]
SystemOpt = Annotated[Optional[str], typer.Option("--system", help="System message for the chat template.", rich_help_panel=GEN)]
GrammarOpt = Annotated[Optional[str], typer.Option("--grammar", metavar="GBNF", help="Constrain the output to a grammar (llama.cpp's GBNF; Lark parses too). Speculation stays on. generate/run.", rich_help_panel=GEN)]
GrammarFileOpt = Annotated[Optional[str], typer.Option("--grammar-file", metavar="FILE", help="--grammar, read from FILE.", rich_help_panel=GEN)]
JsonSchemaOpt = Annotated[Optional[str], typer.Option("--json-schema", "-j", metavar="SCHEMA", help="Constrain the output to JSON matching this JSON schema ('{}': any JSON). generate/run.", rich_help_panel=GEN)]
JsonSchemaFileOpt = Annotated[Optional[str], typer.Option("--json-schema-file", metavar="FILE", help="--json-schema, read from FILE.", rich_help_panel=GEN)]
ChatTemplateOpt = Annotated[Optional[str], typer.Option("--chat-template", metavar="NAME|TEMPLATE", help="Replace the model's chat template: a Jinja template, or a name: any of llama-server's 52 (chatml, llama2, llama3, llama4, mistral-v7, gemma, phi3, phi4, command-r, gpt-oss, granite, ...; docs/serving.md lists them) or mlxcel's mistral.", rich_help_panel=MODEL)]
ChatTemplateFileOpt = Annotated[Optional[str], typer.Option("--chat-template-file", metavar="FILE", help="--chat-template, read from a Jinja file.", rich_help_panel=MODEL)]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Never download: a repo id must already be in the Hugging Face cache (llama.cpp's; also HF_HUB_OFFLINE=1).", rich_help_panel=MODEL)]
JinjaOpt = Annotated[bool, typer.Option("--jinja/--no-jinja", help="llama-server's switch: chat templates are always rendered with Jinja here, so either changes nothing.", rich_help_panel=MODEL)]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable); output ends before it.", rich_help_panel=GEN)]
IgnoreEosOpt = Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past end-of-sequence tokens.", rich_help_panel=GEN)]
ImageOpt = Annotated[Optional[list[str]], typer.Option("--image", help="Image file for a vision-language model (repeatable; in order, before the prompt's text).", rich_help_panel=GEN)]
AudioOpt = Annotated[Optional[list[str]], typer.Option("--audio", help="Audio input (refused: not supported yet).", rich_help_panel=GEN)]
VideoOpt = Annotated[Optional[list[str]], typer.Option("--video", help="Video input (refused: not supported yet).", rich_help_panel=GEN)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Say which model, BLAS and weight dtype are in use.", rich_help_panel=GEN)]
VerifyExactOpt = Annotated[bool, typer.Option("--verify-exact", help="Rerun plainly and report the first token where speculative and plain output differ.", rich_help_panel=SPEC)]

TempOpt = Annotated[float, typer.Option("--temp", "-t", "--temperature", metavar="FLOAT", help="Sampling temperature; 0 is greedy.", rich_help_panel=SAMPLING)]
TopPOpt = Annotated[float, typer.Option("--top-p", metavar="FLOAT", help="Nucleus sampling mass; 1.0 is off.", rich_help_panel=SAMPLING)]
TopKOpt = Annotated[int, typer.Option("--top-k", metavar="K", help="Sample from the K most likely tokens; 0 is off.", rich_help_panel=SAMPLING)]
MinPOpt = Annotated[float, typer.Option("--min-p", metavar="FLOAT", help="Drop tokens below min-p times the top probability; 0 is off.", rich_help_panel=SAMPLING)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", "-s", help="Random seed (-1: random); a seeded speculative run repeats the plain run's draws.", rich_help_panel=SAMPLING)]
RepetitionPenaltyOpt = Annotated[float, typer.Option("--repetition-penalty", "--repeat-penalty", metavar="FLOAT", help="Penalty for repeated tokens; 1.0 is off.", rich_help_panel=SAMPLING)]
RepeatLastNOpt = Annotated[int, typer.Option("--repeat-last-n", metavar="N", help="Tokens the repetition penalty looks back over; -1 whole context, 0 off.", rich_help_panel=SAMPLING)]

# each drafter kind's row (drafters/registry.py) says what these two helps say of it
DraftKindOpt = Annotated[Optional[str], typer.Option("--draft-kind", envvar="MLXCEL_DRAFT_KIND", metavar="KIND", help=registry.kind_help(), rich_help_panel=SPEC)]
DraftBlockSizeOpt = Annotated[Optional[int], typer.Option("--draft-block-size", "--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", metavar="N", help=registry.width_help(), rich_help_panel=SPEC)]
DraftAcceptanceOpt = Annotated[Optional[str], typer.Option("--draft-acceptance", metavar="RULE", help="How a sampled round judges a model drafter's draft: sampler-match (default: the drafter draws with the target's own randomness at each position, and a draft stands when it equals the target's draw, so a seeded reply is plain decoding's, token for token, as llama-server's) or p-q (the drafter samples its own distribution q, accepted with min(1, p/q): the same distribution, a few percent more drafts accepted, other tokens than plain's).", rich_help_panel=SPEC)]
DraftMinOpt = Annotated[Optional[int], typer.Option("--draft-min", "--draft-n-min", "--spec-draft-n-min", metavar="N", help="Verify a draft only when it has at least N tokens; a shorter one is dropped and the round decodes plainly (llama-server's; default 0: every draft).", rich_help_panel=SPEC)]
SpecTypeOpt = Annotated[Optional[str], typer.Option("--spec-type", metavar="TYPE", help="llama-server selector: none turns speculation off; draft-simple = full-model; draft-mtp = mtp.", rich_help_panel=SPEC)]
SuffixCacheTokensOpt = Annotated[Optional[int], typer.Option("--suffix-cache-tokens", metavar="N", help=f"Suffix drafter: tokens of earlier sequences kept (default {O.DEFAULT_SUFFIX_CACHE_TOKENS}), least recently used first out.", rich_help_panel=SPEC)]
DraftTreeBudgetOpt = Annotated[Optional[int], typer.Option("--draft-tree-budget", metavar="N", help="Draft trees: up to N more nodes a round beside the drafter's chain (other earlier matches' continuations, runner-up tokens), verified in the same forward; 0 (default) verifies chains. Greedy only; plain KV-cache models on the row-exact CPU kernel.", rich_help_panel=SPEC)]
DraftTreeMarginOpt = Annotated[Optional[float], typer.Option("--draft-tree-margin", metavar="LOGITS", help="Model drafters' trees: branch only to runner-up tokens whose logit is within this of the step's best (default: everywhere; mlxcel's top-two gap gate).", rich_help_panel=SPEC)]
BenchTreeBudgetOpt = Annotated[Optional[str], typer.Option("--draft-tree-budget", metavar="N,N,...", help="Draft-tree budgets to benchmark each drafter at (0: chains), e.g. 0,8.", rich_help_panel=SPEC)]
# mlxcel's environment variables for its MTP trees: aliases of the two above on --draft-kind mtp
# (read as text: another kind ignores them, so a stray value must not stop every command)
MtpTreeBranchesOpt = Annotated[Optional[str], typer.Option("--mtp-tree-branches", envvar="MLXCEL_MTP_TREE_BRANCHES", hidden=True, help="mlxcel's MLXCEL_MTP_TREE_BRANCHES: --draft-tree-budget on --draft-kind mtp.")]
MtpTreeMarginOpt = Annotated[Optional[str], typer.Option("--mtp-tree-margin", envvar="MLXCEL_MTP_TREE_MARGIN", hidden=True, help="mlxcel's MLXCEL_MTP_TREE_MARGIN: --draft-tree-margin on --draft-kind mtp.")]
SuffixStoreOpt = Annotated[Optional[str], typer.Option("--suffix-store", metavar="FILE", help="Suffix drafter: load the store from FILE at start (if it exists) and save it there at exit.", rich_help_panel=SPEC)]
PpSizeOpt = Annotated[int, typer.Option("--pp-size", metavar="N", help="Pipeline-parallel stages: each rank runs a contiguous run of layers (start the ranks with `mlxcel launch`).", rich_help_panel=DISTRIBUTED)]
TpSizeOpt = Annotated[int, typer.Option("--tp-size", metavar="N", help="Tensor-parallel ranks: each holds 1/N of every layer's heads and feed-forward width (start the ranks with `mlxcel launch`).", rich_help_panel=DISTRIBUTED)]

PromptLookupOpt = Annotated[bool, typer.Option("--prompt-lookup", help="Prompt-lookup speculation (n-gram drafts from the prompt and output). With --draft-model: lookup where the context has a match, the model drafter elsewhere (a composite).", rich_help_panel=LOOKUP)]
NgramMaxOpt = Annotated[Optional[int], typer.Option("--prompt-lookup-ngram-max", metavar="N", help=f"Longest suffix n-gram matched (default {O.DEFAULT_NGRAM_MAX}, at most {O.NGRAM_MAX_LIMIT}).", rich_help_panel=LOOKUP)]
NgramMinOpt = Annotated[Optional[int], typer.Option("--prompt-lookup-ngram-min", metavar="N", help=f"Shortest suffix n-gram matched (default {O.DEFAULT_NGRAM_MIN}).", rich_help_panel=LOOKUP)]
MaxDraftOpt = Annotated[Optional[int], typer.Option("--prompt-lookup-max-draft", metavar="N", help=f"Most tokens proposed per round (default {O.DEFAULT_MAX_DRAFT}, at most {O.MAX_DRAFT_LIMIT}); the verify block is one wider.", rich_help_panel=LOOKUP)]
NoAdaptiveOpt = Annotated[bool, typer.Option("--prompt-lookup-no-adaptive", help="Propose the maximum every round (for A/B measurement).", rich_help_panel=LOOKUP)]
PolicyOpt = Annotated[Optional[str], typer.Option("--prompt-lookup-policy", metavar="auto|graded|gated|cost", help="Draft policy (default auto: gated on CUDA, graded elsewhere; cost: break-even governor from measured verify costs).", rich_help_panel=LOOKUP)]

HostOpt = Annotated[str, typer.Option("--host", help="Address to bind; several, comma-separated (127.0.0.1,::1), share the port.", rich_help_panel=SERVER)]
PortOpt = Annotated[int, typer.Option("--port", help="Port; 0 picks a free one (printed at startup).", rich_help_panel=SERVER)]
MaxBatchOpt = Annotated[Optional[str], typer.Option("--prompt-lookup-max-batch", metavar="N|auto", help="Verify rounds (any drafter) run only while at most N requests are live (default 2) and pay at the batched forward's cost measured at start; above N every request takes the batched plain step. auto: no count, the measured cost alone.", rich_help_panel=SERVER)]
NoBatchOpt = Annotated[bool, typer.Option("--no-batch", help="Serve requests strictly one at a time, with no speculation.", rich_help_panel=SERVER)]
KvUnifiedOpt = Annotated[bool, typer.Option("--kv-unified", "-kvu", help="Every slot gets the whole -c window (one shared budget); turns verify rounds off, as in mlxcel.", rich_help_panel=SERVER)]
WarmupOpt = Annotated[bool, typer.Option("--warmup/--no-warmup", help="Warm every verify width at startup.", rich_help_panel=SERVER)]
ApiKeyOpt = Annotated[Optional[list[str]], typer.Option("--api-key", envvar="LLAMA_API_KEY", help="Require this key ('Authorization: Bearer KEY' or 'X-Api-Key: KEY') on every route but /health and /models; repeat it or separate keys with commas.", rich_help_panel=SERVER)]
ApiKeyFileOpt = Annotated[Optional[str], typer.Option("--api-key-file", metavar="FILE", help="Read API keys from FILE, one per line.", rich_help_panel=SERVER)]
CorsOpt = Annotated[Optional[str], typer.Option("--cors-origins", metavar="ORIGINS", help="Comma-separated origins web pages may call the server from: 'localhost' is any loopback origin and port, '*' any origin (llama-server's default), '' none. Default: localhost (and the chat page itself).", rich_help_panel=SERVER)]
CorsMethodsOpt = Annotated[Optional[str], typer.Option("--cors-methods", metavar="METHODS", help="Methods a CORS preflight allows (default 'GET, POST, DELETE, OPTIONS', llama-server's).", rich_help_panel=SERVER)]
CorsHeadersOpt = Annotated[Optional[str], typer.Option("--cors-headers", metavar="HEADERS", help="Headers a CORS preflight allows (default '*'; list Authorization to send a key from a page).", rich_help_panel=SERVER)]
CorsCredentialsOpt = Annotated[bool, typer.Option("--cors-credentials/--no-cors-credentials", help="Allow credentialed cross-origin requests (default on).", rich_help_panel=SERVER)]
ReasoningOpt = Annotated[Optional[str], typer.Option("--reasoning", metavar="on|off|auto", help="Tell chat templates to think (on) or not (off: enable_thinking false, and a think block the template opens is closed); auto: the template's default.", rich_help_panel=SERVER)]
ReasoningBudgetOpt = Annotated[int, typer.Option("--reasoning-budget", metavar="N", help="llama-server's thinking budget: -1 unlimited, 0 no thinking (as --reasoning off), N: a reply's think block is closed after N tokens.", rich_help_panel=SERVER)]
ChatTemplateKwargsOpt = Annotated[Optional[str], typer.Option("--chat-template-kwargs", metavar="JSON", help='Variables every chat template gets, a JSON object (e.g. \'{"enable_thinking": false}\'); a request\'s chat_template_kwargs add to them.', rich_help_panel=SERVER)]
ReasoningFormatOpt = Annotated[Optional[str], typer.Option("--reasoning-format", metavar="FORMAT", help="How chat replies carry a model's <think> block unless a request says: auto or deepseek (into reasoning_content), deepseek-legacy (that, and the tags kept in content), none (left in content).", rich_help_panel=SERVER)]
ServeVerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Chat replies carry llama-server's __verbose object (the rendered prompt, the settings).", rich_help_panel=SERVER)]
SlotsOpt = Annotated[bool, typer.Option("--slots/--no-slots", help="Serve GET /slots (--no-slots: 501, as llama-server).", rich_help_panel=SERVER)]
BENCH = "Benchmark"
TraceOpt = Annotated[Optional[str], typer.Option("--trace", metavar="FILE.jsonl", help="Multi-turn traces as JSON Lines of {\"turns\": [user messages]}: each turn's prompt is the conversation so far, replayed through one engine per configuration (drafters with memory measured as used).", rich_help_panel="Benchmark")]
WorkloadOpt = Annotated[Optional[str], typer.Option("--workload", metavar="FILE.jsonl", help="Prompts as JSON Lines of {\"kind\", \"prompt\"} (the format of shared/workloads/public.jsonl). Default: a small built-in set.", rich_help_panel=BENCH)]
SweepWidthsOpt = Annotated[Optional[str], typer.Option("--sweep-widths", metavar="W,W,...", help="Run each drafter at each proposal width (e.g. 1,2,4,7,12), plot the sweep and recommend a width.", rich_help_panel=BENCH)]
PlotOpt = Annotated[Optional[str], typer.Option("--plot", metavar="FILE.png", help="Where --sweep-widths writes its plot (default mlxcel-bench-widths.png).", rich_help_panel=BENCH)]
VsOpt = Annotated[Optional[str], typer.Option("--vs", metavar="PEER", help="Also time a peer side by side: mlx-lm (stock plain decode, and its --draft-model path with a drafter) or llama.cpp (llama-cpp-python on the same GGUF: plain, and its prompt lookup at the same widths).", rich_help_panel=BENCH)]
JsonOpt = Annotated[Optional[str], typer.Option("--json", metavar="FILE", help="Write every run and the summary as JSON.", rich_help_panel=BENCH)]
MarkdownOpt = Annotated[bool, typer.Option("--markdown", help="Print the summary as a Markdown table on stdout (for READMEs).", rich_help_panel=BENCH)]
RepeatsOpt = Annotated[int, typer.Option("--repeats", metavar="N", help="Time each prompt under each configuration N times (interleaved) and keep the median-speed run.", rich_help_panel=BENCH)]
BusyOpt = Annotated[int, typer.Option("--busy", metavar="N", help="Run N busy loops (nice 19) in the background during the benchmark, as other programs load a user's machine.", rich_help_panel=BENCH)]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", metavar="N", help="Use at most N prompts of each kind.", rich_help_panel=BENCH)]
# llama-server's spellings on serve: -t is threads there (temperature stays --temp), -n the server cap
ServeTempOpt = Annotated[Optional[float], typer.Option("--temp", "--temperature", metavar="FLOAT", help="Default sampling temperature; 0 is greedy. Sampling flags left out come from the model's generation_config.json, else llama-server's defaults (temp 0.8, top-p 0.95, top-k 40, min-p 0.05).", rich_help_panel=SAMPLING)]
ServeMaxTokensOpt = Annotated[int, typer.Option("--n-predict", "-n", "--predict", "--max-tokens", metavar="N", help="Tokens a request that sets no max_tokens/n_predict (or -1) may generate; -1: until the context window is full. A request's own value wins, as in llama-server.", rich_help_panel=GEN)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t", metavar="N", help="CPU threads for matrix products (OpenBLAS and the row-exact kernel); default: all cores.", rich_help_panel=SERVER)]
CtxSizeOpt = Annotated[int, typer.Option("--ctx-size", "-c", metavar="N", help="Context window in tokens (0: the model's); prompt plus reply never exceed it.", rich_help_panel=GEN)]
ContextShiftOpt = Annotated[bool, typer.Option("--context-shift/--no-context-shift", help="When a generation fills the window, drop half of the context after the first --keep tokens and go on (llama.cpp's; default off: the generation stops there).", rich_help_panel=GEN)]
ImageUrlFetchOpt = Annotated[bool, typer.Option("--image-url-fetch", help="Download http(s) image URLs in requests (10 s, 32 MiB each), from public addresses only; otherwise only data: URLs.", rich_help_panel=SERVER)]
ImageUrlAllowOpt = Annotated[Optional[list[str]], typer.Option("--image-url-allow", metavar="HOST", help="A host --image-url-fetch may download from although it is not public (exact, e.g. 127.0.0.1 or a LAN name); repeat it or separate hosts with commas.", rich_help_panel=SERVER)]
MediaPathOpt = Annotated[Optional[str], typer.Option("--media-path", metavar="DIR", help="Read file:// image URLs in requests as paths inside DIR (llama-server's; nothing outside it); off by default.", rich_help_panel=SERVER)]
RerankingOpt = Annotated[bool, typer.Option("--reranking", "--rerank", help="Serve /rerank and /v1/rerank (llama-server's): a causal-LM reranker (Qwen3-Reranker's kind) scores each document by its next-token odds of yes against no; 501 without. --pooling rank turns it on too.", rich_help_panel=SERVER)]
EmbeddingsOpt = Annotated[bool, typer.Option("--embeddings", "--embedding", help="Serve embeddings at /v1/embeddings and /embedding (llama-server's; 501 without).", rich_help_panel=SERVER)]
PoolingOpt = Annotated[Optional[str], typer.Option("--pooling", metavar="none|mean|cls|last|rank", help="How a prompt's hidden states become one embedding (default last: the last token's, as decoder embedding models read it); rank is llama-server's reranking switch (--reranking).", rich_help_panel=SERVER)]
SlotSavePathOpt = Annotated[Optional[str], typer.Option("--slot-save-path", metavar="DIR", help="Folder for slot files: POST /slots/{id}?action=save|restore|erase writes a cached prompt's KV cache there and reads it back (llama-server's).", rich_help_panel=SERVER)]
KeepOpt = Annotated[int, typer.Option("--keep", metavar="N", help="Tokens from the start of the prompt a context shift keeps (-1: the whole prompt); on serve a request's n_keep overrides it.", rich_help_panel=GEN)]
CacheRamOpt = Annotated[int, typer.Option("--cache-ram", "-cram", metavar="MIB", help=f"Keep finished requests' KV caches up to this many MiB, so a later prompt sharing a prefix (a resent chat history, a common system prompt) skips it; -1 no limit, 0 off (default {O.DEFAULT_CACHE_RAM_MIB}).", rich_help_panel=SERVER)]
ParallelOpt = Annotated[int, typer.Option("--parallel", "-np", metavar="N", help=f"Requests decoded together (llama-server's slots; default {O.DEFAULT_PARALLEL}): their plain steps share one batched forward, the rest wait in the queue. Given, it splits -c across the slots (each gets -c/N tokens) unless -kvu.", rich_help_panel=SERVER)]
MaxPredictMsOpt = Annotated[int, typer.Option("--max-predict-ms", metavar="MS", help="Longest a request may decode, from its first token, before it ends with finish_reason length (0: no limit); a request may ask for less with t_max_predict_ms.", rich_help_panel=SERVER)]
ShutdownGraceOpt = Annotated[int, typer.Option("--shutdown-grace", metavar="SECONDS", help="On SIGTERM/Ctrl-C, how long requests in flight may finish before they are cancelled.", rich_help_panel=SERVER)]
SleepIdleOpt = Annotated[int, typer.Option("--sleep-idle-seconds", metavar="SECONDS", help="After this many seconds with no request, release the model's weights and caches; the next request that needs the model loads it again (llama-server's; -1, the default: never).", rich_help_panel=SERVER)]
ModelsDirOpt = Annotated[Optional[str], typer.Option("--models-dir", metavar="DIR", help="Router mode (llama-server's): serve every model in DIR (.gguf files, model folders), each loaded on first use in a process of its own and picked by a request's \"model\"; GET /models lists them.", rich_help_panel=SERVER)]
ModelsPresetOpt = Annotated[Optional[str], typer.Option("--models-preset", metavar="FILE", help="Router mode (llama-server's): an INI file of models and their serve flags ([*] for every model, [ID] for one, model = PATH to add one, load-on-startup, stop-timeout).", rich_help_panel=SERVER)]
ModelsMaxOpt = Annotated[int, typer.Option("--models-max", metavar="N", help="Router mode: models loaded at once; the least recently used idle one is stopped for another (default 4; 0: no limit).", rich_help_panel=SERVER)]
ModelsAutoloadOpt = Annotated[bool, typer.Option("--models-autoload/--no-models-autoload", help="Router mode: load a model when a request names it (default), or only by POST /models/load.", rich_help_panel=SERVER)]
ToolsOpt = Annotated[Optional[str], typer.Option("--tools", metavar="TOOL1,TOOL2|all", help="Serve llama-server's built-in agent tools at /tools (read_file, file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info, or all): they run commands and write files as this user; experimental, never for untrusted clients (403 without).", rich_help_panel=SERVER)]
ToolsRuntimeOpt = Annotated[Optional[str], typer.Option("--tools-runtime", metavar="SPEC", help="Where --tools run: docker:IMAGE or podman:IMAGE (a container started for this server), docker-container:ID, podman-container:ID or ssh:TARGET (default: this host).", rich_help_panel=SERVER)]
McpServersConfigOpt = Annotated[Optional[str], typer.Option("--mcp-servers-config", metavar="FILE", help="MCP servers whose tools /tools lists as SERVER_TOOL: a JSON file in Cursor's {\"mcpServers\": {...}} layout (experimental; they run as this user).", rich_help_panel=SERVER)]
McpServersJsonOpt = Annotated[Optional[str], typer.Option("--mcp-servers-json", metavar="JSON", help="The same MCP servers' layout, inline.", rich_help_panel=SERVER)]
McpProxyOpt = Annotated[bool, typer.Option("--ui-mcp-proxy", "--webui-mcp-proxy", help="Serve llama-server's MCP CORS proxy: /cors-proxy?url=URL forwards to URL, public addresses only (403 without).", rich_help_panel=SERVER)]
McpProxyAllowOpt = Annotated[Optional[list[str]], typer.Option("--ui-mcp-proxy-allow", metavar="HOST", envvar="LLAMA_ARG_UI_MCP_PROXY_ALLOW", help="A host the MCP CORS proxy may reach although it is not public (exact, e.g. 127.0.0.1); repeat it or separate hosts with commas.", rich_help_panel=SERVER)]
WebuiOpt = Annotated[bool, typer.Option("--webui/--no-webui", "--ui/--no-ui", help="Serve the chat page at / (--no-webui or --no-ui: / is a 404, as llama-server's).", rich_help_panel=SERVER)]
LogDisableOpt = Annotated[bool, typer.Option("--log-disable", help="No per-request access line on stderr.", rich_help_panel=SERVER)]
GpuLayersOpt = Annotated[Optional[str], typer.Option("--n-gpu-layers", "-ngl", "--gpu-layers", metavar="N", help="llama-server's GPU offload (accepted; MLX places the whole model on its device).", rich_help_panel=SERVER)]
FlashAttnOpt = Annotated[Optional[str], typer.Option("--flash-attn", "-fa", metavar="on|off|auto", help="llama-server's flash attention switch (accepted; MLX picks its own attention kernel).", rich_help_panel=SERVER)]
ContBatchingOpt = Annotated[bool, typer.Option("--cont-batching", "-cb", help="llama-server's continuous batching switch (accepted; batching is on whenever -np is above 1).", rich_help_panel=SERVER)]
BackendSamplingOpt = Annotated[bool, typer.Option("--backend-sampling", "-bs", help="llama-server's GPU-side sampling (accepted; sampling here runs beside the model on every device).", rich_help_panel=SERVER)]
BatchSizeOpt = Annotated[Optional[int], typer.Option("--batch-size", "-b", metavar="N", help="llama-server's logical batch size (accepted; prompts are fed in chunks sized for the CPU kernels).", rich_help_panel=SERVER)]
UbatchSizeOpt = Annotated[Optional[int], typer.Option("--ubatch-size", "-ub", metavar="N", help="llama-server's physical batch size (accepted; prompts are fed in chunks sized for the CPU kernels).", rich_help_panel=SERVER)]
CacheIdleSlotsOpt = Annotated[bool, typer.Option("--cache-idle-slots/--no-cache-idle-slots", help="llama-server's switch (accepted: a request's cache goes to the prompt cache, --cache-ram, when it ends; no slot keeps an idle one).", rich_help_panel=SERVER)]
MetricsOpt = Annotated[bool, typer.Option("--metrics", help="Serve GET /metrics: Prometheus text, llama-server's llamacpp: series and ours (501 without it).", rich_help_panel=SERVER)]
AliasOpt = Annotated[Optional[str], typer.Option("--alias", "-a", help="Model names for the API, comma-separated: /v1/models lists them as aliases, its id the first in alphabetical order (llama-server's).", rich_help_panel=SERVER)]
TagsOpt = Annotated[Optional[str], typer.Option("--tags", help="Model tags, comma-separated, listed by /v1/models (informational, as llama-server's).", rich_help_panel=SERVER)]
LoraInitWithoutApplyOpt = Annotated[bool, typer.Option("--lora-init-without-apply", help="Load the --lora adapters at scale 0 (the base model's replies); POST /lora-adapters or a request's 'lora' applies them (llama-server's).", rich_help_panel=SERVER)]
# fmt: on


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _count_or_auto(value: str | None, default: int) -> int | str | None:
    """A count, None for "auto", or the text as given (validate names the flag and rejects it)."""
    text = (value or "").strip().lower()
    return default if value is None else None if text == "auto" else int(text) if text.lstrip("-").isdigit() else value


def _items(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable flag whose values may also be comma-separated (llama-server's), as one list."""
    return tuple(item.strip() for value in values or () for item in value.split(",") if item.strip())


def adapter_specs(
    folder: str | None, loras: list[str] | None, scaled: list[str] | None, without_apply: bool
) -> tuple[O.AdapterSpec, ...]:
    """--adapter-path, then each --lora, then each --lora-scaled (commas split each, as llama-server's);
    a --lora-scaled item whose scale is not a number keeps the item as its path and a NaN scale,
    which validation refuses with the flag's name. --lora-init-without-apply: every scale 0."""
    specs = [O.AdapterSpec(folder, 1.0, "--adapter-path")] if folder else []
    specs += [O.AdapterSpec(path, 1.0, "--lora") for path in _items(loras)]
    for item in _items(scaled):
        path, _, scale = item.rpartition(":")
        try:
            specs.append(O.AdapterSpec(path, float(scale), "--lora-scaled"))
        except ValueError:
            specs.append(O.AdapterSpec(item, math.nan, "--lora-scaled"))
    if without_apply:
        specs = [replace(s, scale=0.0) for s in specs]
    return tuple(specs)


def build_options(command: str, params: dict[str, Any]) -> O.CommandOptions:
    """Map one command's parameter values onto the frozen CommandOptions."""
    g = params.get
    if g("offline"):  # llama.cpp's --offline: read by models/loading and by huggingface_hub itself
        os.environ["HF_HUB_OFFLINE"] = "1"
    return O.CommandOptions(
        command=command,
        model=O.ModelOptions(
            model=g("model"),
            hf_repo=g("hf_repo"),
            hf_file=g("hf_file"),
            revision=g("revision"),
            draft_model=g("draft_model"),
            draft_hf=g("draft_hf"),
            blas=not g("no_blas", False),
            dequantize=not g("no_dequantize", False),
            fast_kernels=not g("no_fast_kernels", False),
            cpu_weights=_given(g("cpu_weights"), O.DEFAULT_CPU_WEIGHTS),
            cache_type_k=_given(g("cache_type_k"), "auto"),
            cache_type_v=_given(g("cache_type_v"), "auto"),
            kv_bits=g("kv_bits"),
            kv_group_size=g("kv_group_size"),
            chat_template=g("chat_template"),
            chat_template_file=g("chat_template_file"),
            mmproj=g("mmproj"),
            no_mmproj=g("no_mmproj", False),
            adapters=adapter_specs(g("adapter_path"), g("lora"), g("lora_scaled"), g("lora_init_without_apply", False)),
        ),
        generation=O.PromptOptions(
            prompt=g("prompt"),
            max_tokens=g("max_tokens", O.DEFAULT_MAX_TOKENS),
            min_tokens=g("min_tokens", 0),
            stop=tuple(g("stop") or ()),
            ignore_eos=g("ignore_eos", False),
            chat_template=not g("no_chat_template", False),
            system=g("system"),
            images=tuple(g("image") or ()),
            audio=tuple(g("audio") or ()),
            video=tuple(g("video") or ()),
            profile=g("profile", False),
            verbose=g("verbose", False),
            verify_exact=g("verify_exact", False),
            grammar=g("grammar"),
            grammar_file=g("grammar_file"),
            json_schema=g("json_schema"),
            json_schema_file=g("json_schema_file"),
        ),
        sampling=O.SamplingOptions(
            temp=_given(g("temp"), O.DEFAULT_TEMP),
            top_p=_given(g("top_p"), O.DEFAULT_TOP_P),
            top_k=_given(g("top_k"), O.DEFAULT_TOP_K),
            min_p=_given(g("min_p"), O.DEFAULT_MIN_P),
            seed=g("seed"),
            repetition_penalty=g("repetition_penalty", O.DEFAULT_REPETITION_PENALTY),
            repeat_last_n=g("repeat_last_n", O.DEFAULT_REPEAT_LAST_N),
        ),
        spec=O.SpecOptions(
            draft_kind=g("draft_kind"),
            draft_block_size=g("draft_block_size"),
            draft_min=g("draft_min"),
            draft_acceptance=g("draft_acceptance"),
            spec_type=g("spec_type"),
            suffix_cache_tokens=g("suffix_cache_tokens"),
            suffix_store=g("suffix_store"),
            tree_budget=g("draft_tree_budget") if command != "bench" else None,  # bench: a list (BenchOptions)
            tree_margin=g("draft_tree_margin"),
            mtp_tree_branches=g("mtp_tree_branches"),
            mtp_tree_margin=g("mtp_tree_margin"),
            lookup=O.PromptLookupOptions(
                enabled=g("prompt_lookup", False),
                ngram_max=g("prompt_lookup_ngram_max"),
                ngram_min=g("prompt_lookup_ngram_min"),
                max_draft=g("prompt_lookup_max_draft"),
                no_adaptive=g("prompt_lookup_no_adaptive", False),
                policy=g("prompt_lookup_policy"),
            ),
        ),
        server=O.ServerOptions(
            host=g("host", O.DEFAULT_HOST),
            port=g("port", O.DEFAULT_PORT),
            prompt_lookup_max_batch=_count_or_auto(g("prompt_lookup_max_batch"), O.DEFAULT_PROMPT_LOOKUP_MAX_BATCH),
            no_batch=g("no_batch", False),
            kv_unified=g("kv_unified", False),
            warmup=g("warmup", True),
            api_keys=tuple(g("api_key") or ()),
            api_key_file=g("api_key_file"),
            alias=g("alias"),
            tags=g("tags"),
            cors_origins=g("cors_origins"),
            cors_methods=g("cors_methods"),
            cors_headers=g("cors_headers"),
            cors_credentials=g("cors_credentials", True),
            slots=g("slots", True),
            reasoning_format=_given(g("reasoning_format"), "auto"),
            reasoning=_given(g("reasoning"), "auto"),
            reasoning_budget=g("reasoning_budget", -1),
            chat_template_kwargs=g("chat_template_kwargs"),
            verbose=g("serve_verbose", False),
            threads=g("threads"),
            ctx_size=g("ctx_size", 0),
            context_shift=g("context_shift", False),
            keep=g("keep", 0),
            slot_save_path=g("slot_save_path"),
            embeddings=g("embeddings", False),
            metrics=g("metrics", False),
            image_url_fetch=g("image_url_fetch", False),
            image_url_allow=_items(g("image_url_allow")),
            media_path=g("media_path"),
            # llama-server's --pooling rank is its reranking switch: the embeddings keep their default
            pooling="last" if g("pooling") == "rank" else _given(g("pooling"), "last"),
            reranking=g("reranking", False) or g("pooling") == "rank",
            cache_ram=g("cache_ram", O.DEFAULT_CACHE_RAM_MIB),
            parallel=_given(g("parallel"), O.DEFAULT_PARALLEL),
            parallel_given=g("parallel") is not None,
            log_disable=g("log_disable", False),
            webui=g("webui", True),
            models_dir=g("models_dir"),
            models_max=g("models_max", 4),
            models_preset=g("models_preset"),
            models_autoload=g("models_autoload", True),
            mcp_proxy=g("mcp_proxy", False),
            tools=_items([g("tools")] if g("tools") else None),
            tools_runtime=g("tools_runtime"),
            mcp_servers_config=g("mcp_servers_config"),
            mcp_servers_json=g("mcp_servers_json"),
            mcp_proxy_allow=_items(g("mcp_proxy_allow")),
            shutdown_grace=g("shutdown_grace", 5),
            sleep_idle_seconds=g("sleep_idle_seconds", -1),
            max_predict_ms=g("max_predict_ms", O.DEFAULT_MAX_PREDICT_MS),
            # serve: sampling flags left out take the model's generation_config.json, else llama-server's
            sampling_given=tuple(k for k in ("temp", "top_p", "top_k", "min_p") if g(k) is not None),
            ignored=tuple(
                flag
                for flag, name in (
                    ("--n-gpu-layers", "n_gpu_layers"),
                    ("--flash-attn", "flash_attn"),
                    ("--batch-size", "batch_size"),
                    ("--backend-sampling", "backend_sampling"),
                    ("--ubatch-size", "ubatch_size"),
                )
                if g(name)
            ),
        ),
        parallel=O.ParallelOptions(tp_size=g("tp_size", 1), pp_size=g("pp_size", 1)),
    )


def build_bench_options(params: dict[str, Any]) -> O.BenchOptions:
    g = params.get
    return O.BenchOptions(
        workload=g("workload"),
        sweep_widths=g("sweep_widths"),
        vs=g("vs"),
        json_path=g("json"),
        markdown=g("markdown", False),
        plot_path=g("plot"),
        limit=g("limit"),
        repeats=g("repeats", 1),
        busy=g("busy", 0),
        trace=g("trace"),
        tree_budgets=g("draft_tree_budget"),
    )


# ---- parameter groups: commands are assembled from these, so each flag is declared once ----
import inspect  # noqa: E402

_P = inspect.Parameter


def _kw(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return _P(name, _P.KEYWORD_ONLY, annotation=annotation, default=default)


MODEL_PARAMS = [
    _kw("model", ModelOpt, None),
    _kw("hf_repo", HfRepoOpt, None),
    _kw("hf_file", HfFileOpt, None),
    _kw("revision", RevisionOpt, None),
    _kw("draft_model", DraftModelOpt, None),
    _kw("draft_hf", DraftHfOpt, None),
    _kw("chat_template", ChatTemplateOpt, None),
    _kw("chat_template_file", ChatTemplateFileOpt, None),
    _kw("jinja", JinjaOpt, False),
    _kw("offline", OfflineOpt, False),
    _kw("mmproj", MmprojOpt, None),
    _kw("no_mmproj", NoMmprojOpt, False),
    _kw("adapter_path", AdapterOpt, None),
    _kw("lora", LoraOpt, None),
    _kw("lora_scaled", LoraScaledOpt, None),
]
RUNTIME_PARAMS = [
    _kw("no_blas", NoBlasOpt, False),
    _kw("no_dequantize", NoDequantizeOpt, False),
    _kw("no_fast_kernels", NoFastKernelsOpt, False),
    _kw("cpu_weights", CpuWeightsOpt, None),
    _kw("cache_type_k", CacheTypeKOpt, None),
    _kw("cache_type_v", CacheTypeVOpt, None),
    _kw("kv_bits", KvBitsOpt, None),
    _kw("kv_group_size", KvGroupSizeOpt, None),
]
# the context window and what a full one does (llama.cpp's -c, --context-shift, --keep): every command
WINDOW_PARAMS = [_kw("ctx_size", CtxSizeOpt, 0), _kw("context_shift", ContextShiftOpt, False), _kw("keep", KeepOpt, 0)]
GENERATION_PARAMS = [
    _kw("prompt", PromptOpt, None),
    _kw("max_tokens", MaxTokensOpt, O.DEFAULT_MAX_TOKENS),
    _kw("min_tokens", MinTokensOpt, 0),
    _kw("profile", ProfileOpt, False),
    _kw("no_chat_template", NoChatTemplateOpt, False),
    _kw("system", SystemOpt, None),
    _kw("stop", StopOpt, None),
    _kw("ignore_eos", IgnoreEosOpt, False),
    _kw("grammar", GrammarOpt, None),
    _kw("grammar_file", GrammarFileOpt, None),
    _kw("json_schema", JsonSchemaOpt, None),
    _kw("json_schema_file", JsonSchemaFileOpt, None),
    _kw("image", ImageOpt, None),
    _kw("audio", AudioOpt, None),
    _kw("video", VideoOpt, None),
    _kw("verbose", VerboseOpt, False),
]
SAMPLING_PARAMS = [
    _kw("temp", TempOpt, O.DEFAULT_TEMP),
    _kw("top_p", TopPOpt, O.DEFAULT_TOP_P),
    _kw("top_k", TopKOpt, O.DEFAULT_TOP_K),
    _kw("min_p", MinPOpt, O.DEFAULT_MIN_P),
    _kw("seed", SeedOpt, None),
    _kw("repetition_penalty", RepetitionPenaltyOpt, O.DEFAULT_REPETITION_PENALTY),
    _kw("repeat_last_n", RepeatLastNOpt, O.DEFAULT_REPEAT_LAST_N),
]
SPEC_PARAMS = [
    _kw("draft_kind", DraftKindOpt, None),
    _kw("draft_block_size", DraftBlockSizeOpt, None),
    _kw("draft_min", DraftMinOpt, None),
    _kw("draft_acceptance", DraftAcceptanceOpt, None),
    _kw("spec_type", SpecTypeOpt, None),
    _kw("verify_exact", VerifyExactOpt, False),
    _kw("suffix_cache_tokens", SuffixCacheTokensOpt, None),
    _kw("suffix_store", SuffixStoreOpt, None),
    _kw("draft_tree_budget", DraftTreeBudgetOpt, None),
    _kw("draft_tree_margin", DraftTreeMarginOpt, None),
    _kw("mtp_tree_branches", MtpTreeBranchesOpt, None),
    _kw("mtp_tree_margin", MtpTreeMarginOpt, None),
]
LOOKUP_PARAMS = [
    _kw("prompt_lookup", PromptLookupOpt, False),
    _kw("prompt_lookup_ngram_max", NgramMaxOpt, None),
    _kw("prompt_lookup_ngram_min", NgramMinOpt, None),
    _kw("prompt_lookup_max_draft", MaxDraftOpt, None),
    _kw("prompt_lookup_no_adaptive", NoAdaptiveOpt, False),
    _kw("prompt_lookup_policy", PolicyOpt, None),
]
DISTRIBUTED_PARAMS = [_kw("tp_size", TpSizeOpt, 1), _kw("pp_size", PpSizeOpt, 1)]
SERVER_PARAMS = [
    _kw("host", HostOpt, O.DEFAULT_HOST),
    _kw("port", PortOpt, O.DEFAULT_PORT),
    _kw("prompt_lookup_max_batch", MaxBatchOpt, None),
    _kw("no_batch", NoBatchOpt, False),
    _kw("kv_unified", KvUnifiedOpt, False),
    _kw("warmup", WarmupOpt, True),
    _kw("api_key", ApiKeyOpt, None),
    _kw("api_key_file", ApiKeyFileOpt, None),
    _kw("cors_origins", CorsOpt, None),
    _kw("cors_methods", CorsMethodsOpt, None),
    _kw("cors_headers", CorsHeadersOpt, None),
    _kw("cors_credentials", CorsCredentialsOpt, True),
    _kw("slots", SlotsOpt, True),
    _kw("reasoning_format", ReasoningFormatOpt, None),
    _kw("reasoning", ReasoningOpt, None),
    _kw("reasoning_budget", ReasoningBudgetOpt, -1),
    _kw("chat_template_kwargs", ChatTemplateKwargsOpt, None),
    _kw("serve_verbose", ServeVerboseOpt, False),
    _kw("alias", AliasOpt, None),
    _kw("tags", TagsOpt, None),
    _kw("threads", ThreadsOpt, None),
    _kw("slot_save_path", SlotSavePathOpt, None),
    _kw("embeddings", EmbeddingsOpt, False),
    _kw("reranking", RerankingOpt, False),
    _kw("image_url_fetch", ImageUrlFetchOpt, False),
    _kw("image_url_allow", ImageUrlAllowOpt, None),
    _kw("media_path", MediaPathOpt, None),
    _kw("pooling", PoolingOpt, None),
    _kw("cache_ram", CacheRamOpt, O.DEFAULT_CACHE_RAM_MIB),
    _kw("parallel", ParallelOpt, None),
    _kw("log_disable", LogDisableOpt, False),
    _kw("webui", WebuiOpt, True),
    _kw("models_dir", ModelsDirOpt, None),
    _kw("models_max", ModelsMaxOpt, 4),
    _kw("models_preset", ModelsPresetOpt, None),
    _kw("models_autoload", ModelsAutoloadOpt, True),
    _kw("mcp_proxy", McpProxyOpt, False),
    _kw("tools", ToolsOpt, None),
    _kw("tools_runtime", ToolsRuntimeOpt, None),
    _kw("mcp_servers_config", McpServersConfigOpt, None),
    _kw("mcp_servers_json", McpServersJsonOpt, None),
    _kw("mcp_proxy_allow", McpProxyAllowOpt, None),
    _kw("shutdown_grace", ShutdownGraceOpt, 5),
    _kw("sleep_idle_seconds", SleepIdleOpt, -1),
    _kw("lora_init_without_apply", LoraInitWithoutApplyOpt, False),
    _kw("max_predict_ms", MaxPredictMsOpt, O.DEFAULT_MAX_PREDICT_MS),
    _kw("n_gpu_layers", GpuLayersOpt, None),
    _kw("flash_attn", FlashAttnOpt, None),
    _kw("cont_batching", ContBatchingOpt, False),
    _kw("batch_size", BatchSizeOpt, None),
    _kw("backend_sampling", BackendSamplingOpt, False),
    _kw("ubatch_size", UbatchSizeOpt, None),
    _kw("metrics", MetricsOpt, False),
    _kw("cache_idle_slots", CacheIdleSlotsOpt, True),
]


def hidden(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """The same options, parsed (so a refusal can name them) but left out of --help."""
    out = []
    for p in params:
        base, info = p.annotation.__origin__, copy.copy(p.annotation.__metadata__[0])
        info.hidden = True
        out.append(p.replace(annotation=Annotated[base, info]))
    return out


# run, chat and serve refuse every --prompt-lookup* flag (generate's), so their help leaves them out
LOOKUP_PARAMS_HIDDEN = hidden(LOOKUP_PARAMS)
BENCH_PARAMS = (
    MODEL_PARAMS
    + [
        _kw("max_tokens", BenchMaxTokensOpt, O.DEFAULT_BENCH_MAX_TOKENS),
        _kw("no_chat_template", NoChatTemplateOpt, False),
        _kw("verbose", VerboseOpt, False),
    ]
    + SAMPLING_PARAMS
    + [
        _kw("draft_kind", DraftKindOpt, None),
        _kw("draft_block_size", DraftBlockSizeOpt, None),
        _kw("suffix_cache_tokens", SuffixCacheTokensOpt, None),
        _kw("draft_tree_budget", BenchTreeBudgetOpt, None),
        _kw("draft_tree_margin", DraftTreeMarginOpt, None),
    ]
    + LOOKUP_PARAMS
    + [
        _kw("workload", WorkloadOpt, None),
        _kw("trace", TraceOpt, None),
        _kw("sweep_widths", SweepWidthsOpt, None),
        _kw("plot", PlotOpt, None),
        _kw("vs", VsOpt, None),
        _kw("json", JsonOpt, None),
        _kw("markdown", MarkdownOpt, False),
        _kw("limit", LimitOpt, None),
        _kw("repeats", RepeatsOpt, 1),
        _kw("busy", BusyOpt, 0),
    ]
    + RUNTIME_PARAMS
)
# serve: llama-server's -t (threads) and -n (cap), so the sampling temperature loses -t there
SERVE_SAMPLING_PARAMS = [
    _kw("temp", ServeTempOpt, None),
    _kw("top_p", TopPOpt, None),
    _kw("top_k", TopKOpt, None),
    _kw("min_p", MinPOpt, None),
] + [p for p in SAMPLING_PARAMS if p.name not in ("temp", "top_p", "top_k", "min_p")]
ALL_MODEL_SIDE = (
    MODEL_PARAMS
    + GENERATION_PARAMS
    + WINDOW_PARAMS
    + SAMPLING_PARAMS
    + SPEC_PARAMS
    + LOOKUP_PARAMS
    + RUNTIME_PARAMS
    + DISTRIBUTED_PARAMS
)
# run and chat: generate's options without the prompt-lookup group in --help
CHAT_SIDE = (
    MODEL_PARAMS
    + GENERATION_PARAMS
    + WINDOW_PARAMS
    + SAMPLING_PARAMS
    + SPEC_PARAMS
    + LOOKUP_PARAMS_HIDDEN
    + RUNTIME_PARAMS
    + DISTRIBUTED_PARAMS
)


def positional_model(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """`run MODEL`: the model as an optional positional argument instead of -m."""
    rest = [p for p in params if p.name != "model"]
    return [_P("model", _P.POSITIONAL_OR_KEYWORD, annotation=ModelArg, default=None)] + [
        p.replace(kind=_P.KEYWORD_ONLY) for p in rest
    ]
