"""From an HTTP request to a Job: the body read strictly, the fields checked, the prompt ids.

A request body is read strictly (`http.read_json`), checked for fields we cannot honour
(`schemas.refuse_unsupported`), validated by its pydantic model, then turned into a `Job`: prompt
ids, sampling (request fields over the server defaults, ranges checked by the CLI's own
`validate.check_sampling`), the token budget (capped by the server's `-n`), stops, logprobs and
the compiled grammar. Token ids a client sends are checked against the vocabulary: MLX's embedding
lookup does no bounds check, so an id past it would crash the process.

Nothing whose cost grows with what a client sends runs on the event loop: validation (a tool's
schema is compiled there), templating, tokenizing (prompts, logit_bias texts) and compiling the
grammar all run in a thread (`parse`, the routes' `asyncio.to_thread`, `job`), so one hostile
request cannot stall `/health` or another client's stream; and the worker thread, which decodes
every live request, gets a job whose grammar is already compiled. A request that carries a grammar
or tools is read and built on a pool of its own, one at a time (`GRAMMAR_POOL`): eight slow but
valid grammars on asyncio's shared pool held a plain chat request 17 s on this 2-core machine;
queued behind each other, they hold up only requests that carry grammars too.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from ..engine.context_shift import ContextShift, configured
from ..engine.grammar import GrammarError, TokenizerIndex
from ..engine.thinking_budget import ThinkingBudget
from ..errors import UsageError
from ..formats.prompting import beyond_any_tokenization, longest_token_chars, render_messages, template_source
from ..formats.template_vars import reserved_in
from ..inputs.digits import whole_number
from ..options import SamplingOptions
from ..validate import check_sampling
from . import image_parts, reasoning, schemas, tool_calls, tool_formats
from .http import BODY_LIMIT, ApiError, read_json
from .worker import Job

Body = TypeVar("Body", bound=BaseModel)
HTTP_SAMPLING_NAMES = {
    "temp": "'temperature'",
    "top_p": "'top_p'",
    "top_k": "'top_k'",
    "min_p": "'min_p'",
    "repetition_penalty": "'repeat_penalty'",
    "repeat_last_n": "'repeat_last_n'",
    "seed": "'seed'",
}
MAX_PROMPTS = 16  # prompts in one batch request
MAX_LOGIT_BIAS = 4096  # entries of a request's logit_bias
MAX_LOGIT_BIAS_CHARS = 65536  # characters of its text keys together (each is tokenized)
GRAMMAR_FIELDS = ("grammar", "json_schema", "response_format", "tools", "text")  # ("text": Responses' format)
# where requests carrying grammars or tools are read and built (see the module note)
GRAMMAR_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxcel-grammar")


async def _off_loop(constrained: bool, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` in a thread: GRAMMAR_POOL's for a request with a grammar or tools,
    asyncio's own pool for the rest."""
    if not constrained:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(GRAMMAR_POOL, functools.partial(fn, *args, **kwargs))


ROLE_FOR_TEMPLATE = {"developer": "system"}  # OpenAI's newer name for the system turn


@contextmanager
def template_refusal() -> Iterator[None]:
    """A chat template that refuses the conversation (its `raise_exception`, an undefined field
    it needs, text joined to an object it did not expect) is the request's fault: a 400 with the
    template's words, not a 500."""
    import jinja2

    try:
        yield
    except jinja2.TemplateError as exc:
        raise ApiError(f"the chat template cannot render these messages: {exc.message or type(exc).__name__}") from None
    except TypeError as exc:  # template code only runs here: e.g. '+' on a call's arguments object
        raise ApiError(f"the chat template cannot render these messages: {exc}") from None


def _prefill(turns: list[dict]) -> bool:
    """Whether the conversation ends with an assistant turn for the reply to continue (llama-server
    and Anthropic's prefill); two assistant turns at the end are refused as llama-server does."""
    if len(turns) >= 2 and turns[-1]["role"] == turns[-2]["role"] == "assistant":
        raise ApiError("Cannot have 2 or more assistant messages at the end of the list")
    last = turns[-1] if turns else {}
    return last.get("role") == "assistant" and bool(last.get("content")) and not last.get("tool_calls")


@dataclass(frozen=True)
class Rendering:
    """One request's say on its chat template: `add_generation_prompt` (None: the default, true
    unless the reply continues a final assistant turn) and variables for the template."""

    add_generation_prompt: bool | None = None
    kwargs: dict = field(default_factory=dict)


@dataclass
class RequestReader:
    tokenizer: Any
    vocab: int  # the embedding's rows: token ids must be below it
    context_length: int
    defaults: SamplingOptions
    max_tokens: int  # the server's -n: a request's budget when it sets none (-1: the window)
    body_limit: int = BODY_LIMIT
    max_predict_ms: int = 0  # the server's --max-predict-ms (0: none)
    eos_ids: tuple[int, ...] = ()  # the engine's, for compiling grammars
    grammar_vocab: int | None = None  # the engine's vocab_size, for compiling grammars
    # variables every chat template gets (--chat-template-kwargs, --reasoning's enable_thinking)
    template_kwargs: dict = field(default_factory=dict)
    reasoning_budget: int = -1  # --reasoning-budget: -1 unlimited, N > 0 a reply's thinking capped
    min_draft: int = 0  # --draft-min: a request's speculative.n_min when it sends none
    context_shift: ContextShift | None = None  # --context-shift (None: a full window ends a reply)
    vision: Any = None  # a vision-language model's vision.prompts.Vision (None: image parts are refused)
    images: image_parts.ImageSources = image_parts.ImageSources()  # --image-url-fetch, --media-path
    adapters: Any = None  # adapter_variants.AdapterVariants under --lora (None: no adapters)

    async def parse(self, request: Request, model: type[Body]) -> Body:
        data = await read_json(request, self.body_limit)
        refused = schemas.refuse_unsupported(data, takes_n="n" in model.model_fields)
        if refused:
            raise ApiError(refused, code="unsupported_field")
        constrained = any(data.get(k) for k in GRAMMAR_FIELDS)
        return await _off_loop(constrained, self.validate, data, model)  # a tool's schema compiles there

    @staticmethod
    def validate(data: dict, model: type[Body]) -> Body:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ApiError(schemas.describe(exc)) from None

    def logit_bias(self, value: Any) -> tuple[tuple[int, float], ...]:
        """OpenAI's {"token id": bias} map, or llama-server's [[id or text, bias or false], ...]
        (a text biases each of its tokens; false bans)."""
        if value is None:
            return ()
        pairs = list(value.items()) if isinstance(value, dict) else value
        if not isinstance(pairs, list):
            raise ApiError("'logit_bias' must be an object of token ids to biases, or a list of [token, bias] pairs")
        if len(pairs) > MAX_LOGIT_BIAS:
            raise ApiError(f"'logit_bias' has {len(pairs)} entries; the limit is {MAX_LOGIT_BIAS}")
        texts = sum(len(p[0]) for p in pairs if isinstance(p, (list, tuple)) and p and isinstance(p[0], str))
        if texts > MAX_LOGIT_BIAS_CHARS:
            raise ApiError(
                f"'logit_bias' keys hold {texts} characters of text; the limit is {MAX_LOGIT_BIAS_CHARS} "
                "(bias tokens by id, or by short texts)"
            )
        out: dict[int, float] = {}
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise ApiError("'logit_bias': each entry must be a [token, bias] pair")
            key, bias = pair
            if bias is False:
                bias = float("-inf")
            elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
                raise ApiError("'logit_bias': a bias must be a finite number (or false to ban the token)")
            if isinstance(key, int) and not isinstance(key, bool):
                ids = [key]
            elif isinstance(key, str) and whole_number(key.lstrip("-")):  # ("²" is text, as any other key)
                ids = [int(key)]
            elif isinstance(key, str) and key:
                ids = list(self.tokenizer.encode(key, add_special_tokens=False))
            else:
                raise ApiError("'logit_bias': a token must be an id or a non-empty string")
            for t in ids:
                if not 0 <= t < self.vocab:
                    raise ApiError(f"'logit_bias': token id {t} is outside the vocabulary (0..{self.vocab - 1})")
                out[t] = float(bias)
        return tuple(out.items())

    def sampling(self, req: schemas.Sampling) -> SamplingOptions:
        d = self.defaults
        s = replace(
            d,
            logit_bias=self.logit_bias((req.model_extra or {}).get("logit_bias")),
            temp=d.temp if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            top_k=d.top_k if req.top_k is None else req.top_k,
            min_p=d.min_p if req.min_p is None else req.min_p,
            seed=d.seed if req.seed is None else req.seed,
            repetition_penalty=next(
                (v for v in (req.repeat_penalty, req.repetition_penalty) if v is not None), d.repetition_penalty
            ),
        )
        try:
            check_sampling(s, HTTP_SAMPLING_NAMES)
        except UsageError as exc:
            raise ApiError(exc.message) from None
        return replace(s, seed=None) if s.seed == -1 else s  # llama-server: -1 means random

    def budget(self, req: schemas.Sampling, prompt: list[int]) -> int:
        n = req.requested_tokens()
        if n is not None and n < -1:
            raise ApiError(f"'max_tokens' must be -1 or >= 0, got {n}")
        if len(prompt) >= self.context_length:
            raise ApiError(
                f"request ({len(prompt)} tokens) exceeds the available context size ({self.context_length} tokens), "
                "try increasing it (--ctx-size)",  # llama-server's words, which clients match
                type="exceed_context_size_error",
                extra={"n_prompt_tokens": len(prompt), "n_ctx": self.context_length},  # llama-server's fields
            )
        # the server's -n/--n-predict is the budget of a request that sets none (or -1), as in
        # llama-server (which no longer clamps a request's own n_predict to it); the window caps all
        return self.max_tokens if n is None or n == -1 else n

    def token_ids(self, values: list[int], key: str) -> list[int]:
        if not all(0 <= t < self.vocab for t in values):
            raise ApiError(f"'{key}' token ids must be integers in 0..{self.vocab - 1} (the model's vocabulary)")
        return list(values)

    def mixed_ids(self, value: str | list, key: str) -> list[int]:
        """Text, or token ids and text mixed (llama-server's tokenize_mixed), as ids: no BOS."""
        parts = [value] if isinstance(value, str) else value
        ids: list[int] = []
        for part in parts:
            if isinstance(part, str):
                self.fits(len(part))
                ids += self.tokenizer.encode(part, add_special_tokens=False) if part else []
            else:
                ids += self.token_ids([part], key)
        return ids

    def prompts(self, prompt: Any) -> list[list[int]]:
        """llama-server's prompt forms, one id list per prompt: a string, token ids, ids and
        strings mixed in one sequence, a `{prompt_string}` object, or a list (batch) of these."""
        if not isinstance(prompt, list) or (
            prompt and all(isinstance(p, (int, str)) for p in prompt) and any(isinstance(p, int) for p in prompt)
        ):
            return [self.one_prompt(prompt)]
        if not prompt:
            raise ApiError("'prompt' must not be empty")
        if len(prompt) > MAX_PROMPTS:
            raise ApiError(f"'prompt': at most {MAX_PROMPTS} prompts in one request, got {len(prompt)}")
        return [self.one_prompt(p) for p in prompt]

    def one_prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, schemas.PromptObject):
            if prompt.multimodal_data:
                self.fits(len(prompt.prompt_string))
                return image_parts.raw_prompt_ids(self.vision, prompt.prompt_string, prompt.multimodal_data)
            prompt = prompt.prompt_string
        if not prompt:
            raise ApiError("'prompt' must be a non-empty string (or a list of token ids)")
        if isinstance(prompt, str):
            self.fits(len(prompt))
            return list(self.tokenizer.encode(prompt))
        ids: list[int] = []
        for part in prompt:  # ids and strings in one sequence: each string tokenized in place
            if isinstance(part, str):
                self.fits(len(part))
                ids += self.tokenizer.encode(part, add_special_tokens=False) if part else []
            else:
                ids.append(part)
        return self.token_ids(ids, "prompt")

    def rendering(self, body: Any) -> Rendering:
        """A chat request's own say on its template (llama-server's fields beside the messages):
        `add_generation_prompt` and `chat_template_kwargs`, over the server's."""
        extra = body.model_extra or {}
        kwargs = extra.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ApiError("'chat_template_kwargs' must be an object of the template's variables")
        if kwargs and (why := reserved_in(kwargs)) is not None:
            raise ApiError(f"'chat_template_kwargs': {why}; 'add_generation_prompt' is a field of its own")
        gen = extra.get("add_generation_prompt")
        if gen is not None and not isinstance(gen, bool):
            raise ApiError("'add_generation_prompt' must be true or false")
        return Rendering(gen, kwargs or {})

    def chat_prompt(
        self,
        messages: list[schemas.Message],
        tools: list[schemas.Tool] | None = None,
        rendering: Rendering | None = None,
    ) -> list[int]:
        turns = [
            {"role": m.role, "content": m.content_parts()}
            | ({"tool_calls": [c.model_dump(exclude_none=True) for c in m.tool_calls]} if m.tool_calls else {})
            | ({"tool_call_id": m.tool_call_id} if m.tool_call_id else {})
            | ({"reasoning_content": m.reasoning_content} if m.reasoning_content else {})
            | ({"name": m.model_extra["name"]} if isinstance((m.model_extra or {}).get("name"), str) else {})
            for m in messages
        ]
        return self.tool_prompt(turns, [t.model_dump(exclude_none=True) for t in tools or []], rendering)

    def tool_prompt(self, turns: list[dict], listed: list[dict], rendering: Rendering | None = None) -> list[int]:
        """Prompt ids of turns (with tool calls and results) and the tools offered (chat shape).
        A conversation that ends with an assistant turn is a prefill: the reply continues it."""
        rendering = rendering or Rendering()
        prefill = _prefill(turns)
        if prefill and rendering.add_generation_prompt:
            raise ApiError(
                "'add_generation_prompt' cannot be true when the last message is the assistant's to continue "
                "(a prefill): drop one of the two"
            )
        if not listed:
            return self.turns_prompt(turns, prefill=prefill, rendering=rendering)
        if tool_calls.template_takes_tools(self.tokenizer):
            turns = [{**t, "role": ROLE_FOR_TEMPLATE.get(t["role"], t["role"])} for t in tool_calls.native_turns(turns)]
            texts = ("name", "reasoning_content")
            chars = sum(len(t.get(k) or "") for t in turns for k in texts)
            self.fits(chars + sum(len(image_parts.text_of(t.get("content"))) for t in turns) + len(str(listed)))
            return self._render(turns, prefill, rendering, tools=listed)
        return self.turns_prompt(tool_calls.generic_turns(turns, listed), prefill=prefill, rendering=rendering)

    def tools(self, req: Any) -> tuple[list[dict], Any]:
        """A request's tools (the chat route's shape) and the grammar its reply must follow (None:
        free text), for any route whose request has `tool_list()` and `choice()`."""
        try:
            choice = req.choice()
        except ValueError as exc:
            raise ApiError(str(exc)) from None
        listed = req.tool_list()
        names = [
            t["function"]["name"] for t in listed if isinstance(t.get("function"), dict) and "name" in t["function"]
        ]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # a call names its tool: two with one name could not be told apart
            raise ApiError(f"'tools': function names must be unique; {', '.join(repeated[:3])} appears more than once")
        return listed, self.tools_grammar(listed, choice)

    def tools_grammar(self, listed: list[dict], choice: Any):
        """The grammar a reply must follow given the tools offered (chat shape) and tool_choice."""
        if choice is not None and not listed:
            raise ApiError("'tool_choice' needs 'tools'")
        if not listed:
            return None
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in {t["function"]["name"] for t in listed}:
                raise ApiError(f"'tool_choice' names {name}, which is not one of the tools")
        native = tool_calls.template_takes_tools(self.tokenizer)
        fmt = tool_formats.call_format(template_source(self.tokenizer))
        special = tool_calls.special_tokens(self.tokenizer) if native else frozenset()
        return tool_calls.constraint(listed, choice or "auto", native=native, fmt=fmt, special=special)

    def turns_prompt(self, turns: list[dict], prefill: bool = False, rendering: Rendering | None = None) -> list[int]:
        """Prompt ids of {role, content} turns through the model's chat template."""
        turns = [
            {"role": ROLE_FOR_TEMPLATE.get(t["role"], t["role"]), "content": t["content"]}
            | ({"reasoning_content": t["reasoning_content"]} if t.get("reasoning_content") else {})
            for t in turns
        ]
        self.fits(sum(len(image_parts.text_of(t["content"])) + len(t.get("reasoning_content", "")) for t in turns))
        return self._render(turns, prefill, rendering or Rendering())

    def _render(self, turns: list[dict], prefill: bool, rendering: Rendering, tools: list[dict] | None = None):
        if image_parts.has_images(turns):
            extra = {**self.template_kwargs, **rendering.kwargs, **({"tools": tools} if tools else {})}
            gen = rendering.add_generation_prompt is not False
            return image_parts.prompt_ids(
                self.vision,
                self.tokenizer,
                turns,
                sources=self.images,
                add_generation_prompt=gen,
                continue_last=prefill,
                extra=extra,
            )
        with template_refusal():
            return render_messages(
                self.tokenizer,
                turns,
                continue_last=prefill,
                add_generation_prompt=rendering.add_generation_prompt is not False,
                tools=tools,
                extra={**self.template_kwargs, **rendering.kwargs},
            )

    def fits(self, chars: int) -> None:
        """Refuse, before tokenizing, text that cannot fit the context in any tokenization: no
        token is longer than the vocabulary's longest entry, so more characters than that times
        the context window is over it. A 7 MB body under the size limit was tokenized in full
        (7-10 s, +336 MB) only to be refused."""
        if beyond_any_tokenization(chars, self.context_length, self.longest_token_chars):
            raise ApiError(
                f"the prompt has {chars} characters, more than the context window ({self.context_length} "
                f"tokens) can hold in any tokenization",
                type="exceed_context_size_error",
            )

    @functools.cached_property
    def longest_token_chars(self) -> int:
        return longest_token_chars(self.tokenizer)

    async def job(
        self,
        req: schemas.Sampling,
        prompt: list[int],
        logprobs: int | None = None,
        grammar=None,
        constraint_fields: dict | None = None,
    ) -> Job:
        """`make_job` in a thread: checking and compiling a grammar and tokenizing logit_bias
        texts grow with the request."""
        fields = constraint_fields if constraint_fields is not None else req.model_extra or {}
        constrained = grammar is not None or any(fields.get(k) for k in GRAMMAR_FIELDS)
        return await _off_loop(constrained, self.make_job, req, prompt, logprobs, grammar, fields)

    def make_job(self, req: schemas.Sampling, prompt: list[int], logprobs: int | None, grammar, fields: dict) -> Job:
        """`grammar`: one the route requires (tool calls); else the request's own, if any, read
        from `fields` (`job` resolves them: `constraint_fields`, else the body's extra fields)."""
        try:
            asked = schemas.grammar_spec(fields)
        except ValueError as exc:
            raise ApiError(str(exc), code="invalid_grammar") from None
        if grammar is not None and asked is not None:
            raise ApiError("'tools' and 'response_format' both constrain the reply; pass one")
        grammar = grammar or asked
        return Job(
            prompt=prompt,
            grammar=grammar,
            constraint=self.constraint(grammar)
            if grammar is not None
            else self.thinking_budget(prompt, req.thinking_budget()),
            max_tokens=self.budget(req, prompt),
            sampling=self.sampling(req),
            stop=req.stops(),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            post_sampling=bool(getattr(req, "post_sampling_probs", False)),
            speculative=req.speculative(),
            min_draft=self.min_draft if req.speculative_n_min is None else req.speculative_n_min,
            cache_prompt=req.cache_prompt is not False,
            predict_ms=self.predict_ms(req),
            shift=self.shift(req, prompt),
            progress=req.stream and (req.model_extra or {}).get("return_progress") is True,
            timings_per_token=req.stream and (req.model_extra or {}).get("timings_per_token") is True,
            adapter_scales=self.adapter_scales((req.model_extra or {}).get("lora")),
        )

    def adapter_scales(self, value: Any) -> tuple[float, ...] | None:
        """A request's `lora` list (or POST /lora-adapters' body) as the scales it names (None:
        the server's; also an empty list on a server without adapters); a 400 naming what is wrong."""
        if value is None:
            return None
        if self.adapters is None:
            if value == []:
                return None
            raise ApiError("invalid adapter id: this server has no LoRA adapters (start it with --lora)")
        try:
            return self.adapters.requested(value)
        except ValueError as exc:
            raise ApiError(str(exc)) from None

    def shift(self, req: schemas.Sampling, prompt: list[int]) -> ContextShift | None:
        """The request's context shift under --context-shift: its n_keep (else --keep) and
        n_discard; a kept count does not count the BOS, as llama-server adds it."""
        if self.context_shift is None:
            return None
        keep = self.context_shift.keep if req.n_keep is None else req.n_keep
        return configured(keep, prompt, getattr(self.tokenizer, "bos_token_id", None), req.n_discard or 0)

    def constraint(self, grammar):
        """The grammar compiled for this tokenizer (engine.grammar.Constraint), or None; a 400
        for one over a limit or that does not compile."""
        if grammar is None:
            return None
        vocab = self.grammar_vocab or self.vocab
        try:
            return TokenizerIndex.of(self.tokenizer, vocab, self.eos_ids).compile(grammar)
        except GrammarError as exc:
            raise ApiError(str(exc), code="invalid_grammar") from None

    def thinking_budget(self, prompt: list[int], asked: int | None = None) -> ThinkingBudget | None:
        """--reasoning-budget N (N > 0): the reply's think block capped at N tokens, then closed
        (engine/thinking_budget.py); where the server's is -1 (unlimited), the request's own
        (`thinking_budget_tokens`, Anthropic's `thinking.budget_tokens`; 0 closes it at once), as
        llama-server reads them. The server's 0 turns thinking off in the template instead. Under
        a grammar the reply is the grammar's, not thinking."""
        budget = asked if self.reasoning_budget == -1 else self.reasoning_budget
        if budget is None or budget < 0 or (budget == 0 and self.reasoning_budget == 0):
            return None
        opened = reasoning.opened_by(self.tokenizer.decode(prompt[-32:]))
        encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
        open_ids, close_ids = encode(reasoning.OPEN), encode(reasoning.CLOSE)
        if not open_ids or not close_ids:  # a tokenizer that cannot spell the tags: nothing to cap
            return None
        return ThinkingBudget(budget, open_ids, close_ids, opened=opened)

    def predict_ms(self, req: schemas.Sampling) -> float | None:
        """The request's decoding time limit: its own t_max_predict_ms within the server's."""
        asked = req.t_max_predict_ms
        if asked is not None and asked < 0:
            raise ApiError(f"'t_max_predict_ms' must be >= 0 (0: no limit of its own), got {asked}")
        limits = [v for v in (asked, self.max_predict_ms) if v]
        return float(min(limits)) if limits else None
