"""SuffixDecoding (arXiv 2411.04975): drafts from the current context and from earlier sequences.

The store and the index are pure Python over token ids (no MLX). Two sources, matched the same way:
- the live context (prompt and output so far), and
- a store of earlier sequences (prompts and outputs of earlier turns, requests and runs), bounded
  by a token budget with least-recently-used eviction, saved to and loaded from a file.
Each round the longest suffix of the context (up to MAX_MATCH tokens) is found in a source; the
occurrences that follow it vote, token by token, for a continuation: the most frequent next token
is taken while the running product of its conditional frequencies stays above `min_token_prob`,
up to `max_spec_factor` x the match length (a longer match earns a longer draft) and the budget.
That is the paper's greedy path through the suffix tree's frequency counts, computed on demand
from an n-gram occurrence index instead of a materialized tree (memory O(tokens x NGRAM_MAX)).
The source whose draft has the higher score (expected accepted tokens) wins. Drafts are verified
by the shared verify round, so output equals plain decoding whatever the store holds.
Trees (engine/tree.py; the paper's speculation tree): the greedy path first, then the winning
source's other continuations best first by their running probability, each at least
`min_token_prob`.
"""

from __future__ import annotations

import heapq
import json
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..engine.tree import DraftTree
from ..errors import ModelError
from ..inputs.digits import whole_number
from ..inputs.files import MIB, UnreadableFile, read_text
from .base import Drafter, DrafterSource, Plan, Proposal, stop_at_eos

NGRAM_MAX = 6  # the index keys n-grams of 1..NGRAM_MAX tokens
MAX_MATCH = 32  # how far back a match is measured (sizes the draft)
MAX_OCCURRENCES = 64  # the most recent occurrences that vote
DEFAULT_MAX_SPEC_FACTOR = 1.0
DEFAULT_MIN_TOKEN_PROB = 0.1
DEFAULT_CACHE_TOKENS = 200_000
STORE_FORMAT = "mlxcel-suffix-store"
STORE_VERSION = 1


class _Index:
    """Occurrences of every n-gram (n <= NGRAM_MAX) over a set of sequences: n-gram -> [(seq, end)],
    where `end` is the position just after the n-gram (the first token that followed it)."""

    def __init__(self):
        self.grams: dict[tuple[int, ...], list[tuple[int, int]]] = {}

    def add(self, sid: int, toks: Sequence[int], start: int = 0) -> None:
        """Index the n-grams of `toks` that end at positions >= start (each needs a follower)."""
        grams = self.grams
        for end in range(max(start, 1), len(toks)):
            for n in range(1, min(NGRAM_MAX, end) + 1):
                grams.setdefault(tuple(toks[end - n : end]), []).append((sid, end))

    def occurrences(self, key: tuple[int, ...]) -> list[tuple[int, int]]:
        return self.grams.get(key, [])


def _match(context: Sequence[int], seqs, occ: list[tuple[int, int]], n: int) -> tuple[list[tuple[int, int]], int]:
    """Keep the most recent occurrences and measure how far back the best of them agrees."""
    occ = occ[-MAX_OCCURRENCES:]
    best = n
    for sid, end in occ:
        toks = seqs[sid]
        length = n
        while (
            length < MAX_MATCH
            and end - 1 - length >= 0
            and length < len(context)
            and toks[end - 1 - length] == context[len(context) - 1 - length]
        ):
            length += 1
        best = max(best, length)
    return occ, best


def _votes(seqs, live: list[tuple[int, int]]) -> dict[int, int]:
    """How many of the live occurrences continue with each token."""
    counts: dict[int, int] = {}
    for sid, end in live:
        t = seqs[sid][end]
        counts[t] = counts.get(t, 0) + 1
    return counts


def _follow(seqs, live: list[tuple[int, int]], tok: int) -> list[tuple[int, int]]:
    """The occurrences that continue with `tok`, one token further on."""
    return [(sid, end + 1) for sid, end in live if seqs[sid][end] == tok and end + 1 < len(seqs[sid])]


def _live(seqs, occ: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(sid, end) for sid, end in occ if end < len(seqs[sid])]


def _grow(seqs, occ: list[tuple[int, int]], limit: int, min_prob: float) -> tuple[list[int], float]:
    """The frequency-greedy path after the occurrences: tokens, and its score (the sum of the
    running probabilities: the expected number of accepted tokens if the counts are right)."""
    out: list[int] = []
    score, prob = 0.0, 1.0
    live = _live(seqs, occ)
    while live and len(out) < limit:
        tok, c = max(_votes(seqs, live).items(), key=lambda kv: kv[1])
        prob *= c / len(live)
        if prob < min_prob:
            break
        out.append(tok)
        score += prob
        live = _follow(seqs, live, tok)
    return out, score


def _tree(
    seqs, occ: list[tuple[int, int]], chain: Sequence[int], limit: int, min_prob: float, nodes: int
) -> DraftTree | None:
    """`chain` (the greedy path) and up to `nodes` other nodes at most `limit` deep: the
    continuations the occurrences vote for, taken best first by running probability while it is
    at least `min_prob`."""
    parents = list(range(-1, len(chain) - 1))
    tokens = list(chain)
    heap: list[tuple[float, int, int, int, list]] = []  # (-prob, order, parent, token, its live occurrences)
    order = 0

    def offer(node: int, depth: int, prob: float, live: list, skip: int | None) -> None:
        nonlocal order
        if depth >= limit or not live:
            return
        for tok, c in _votes(seqs, live).items():
            p = prob * c / len(live)
            if tok != skip and p >= min_prob:
                heapq.heappush(heap, (-p, order, node, tok, live))
                order += 1

    live, prob = _live(seqs, occ), 1.0
    for d, tok in enumerate(chain):  # beside every node of the chain: the other voted tokens
        offer(d - 1, d, prob, live, tok)
        prob *= _votes(seqs, live)[tok] / len(live)
        live = _follow(seqs, live, tok)
    depth = list(range(1, len(chain) + 1))
    while heap and len(tokens) - len(chain) < nodes:
        neg, _, parent, tok, live = heapq.heappop(heap)
        tokens.append(tok)
        parents.append(parent)
        depth.append(1 if parent < 0 else depth[parent] + 1)
        offer(len(tokens) - 1, depth[-1], -neg, _follow(seqs, live, tok), None)
    return DraftTree(tuple(tokens), tuple(parents)) if len(tokens) > len(chain) else None


def draft_from(
    context: Sequence[int], index: _Index, seqs, limit: int, *, factor: float, min_prob: float, nodes: int = 0
) -> tuple[list[int], float, int, set[int], DraftTree | None]:
    """(draft, score, match length, the sequences that voted, and with `nodes` a tree of up to
    that many more nodes, or None) for `context` against one source."""
    for n in range(min(NGRAM_MAX, len(context)), 0, -1):
        occ = [o for o in index.occurrences(tuple(context[len(context) - n :])) if o[0] in seqs]
        if occ:
            occ, match = _match(context, seqs, occ, n)
            cap = min(limit, max(1, int(factor * match)))
            toks, score = _grow(seqs, occ, cap, min_prob)
            tree = _tree(seqs, occ, toks, cap, min_prob, nodes) if nodes and toks else None
            return toks, score, match, {sid for sid, _ in occ}, tree
    return [], 0.0, 0, set(), None


class SuffixStore:
    """Earlier sequences, most recently used last, within `budget` tokens."""

    def __init__(self, budget: int = DEFAULT_CACHE_TOKENS):
        self.budget = budget
        self.seqs: dict[int, list[int]] = {}
        self._order: OrderedDict[int, None] = OrderedDict()
        self._next = 0
        self.tokens = 0
        self.stale = 0  # indexed tokens of dropped sequences (their entries are skipped, then rebuilt away)
        self.index = _Index()

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, toks: Sequence[int]) -> None:
        """Remember a sequence. One that strictly extends the newest one (the next turn of a
        conversation) replaces it instead of counting its shared prefix twice; an equal one counts
        again (a repeated answer is a more frequent one)."""
        toks = list(toks)
        if len(toks) < 2:
            return
        if self._order:
            last = next(reversed(self._order))
            prev = self.seqs[last]
            if len(toks) > len(prev) and toks[: len(prev)] == prev:
                self._drop(last)
        sid = self._next
        self._next += 1
        self.seqs[sid] = toks[-self.budget :]
        self._order[sid] = None
        self.tokens += len(self.seqs[sid])
        self.index.add(sid, self.seqs[sid])
        self._evict()

    def _drop(self, sid: int) -> None:
        n = len(self.seqs.pop(sid))
        self.tokens -= n
        self.stale += n
        del self._order[sid]

    def _evict(self) -> None:
        if self.tokens <= self.budget:
            if self.stale > max(self.tokens, 1024):  # mostly dead entries: rebuild
                self._rebuild()
            return
        # evict down to 90% of the budget at once, so the index is rebuilt rarely
        while self.tokens > self.budget * 0.9 and len(self._order) > 1:
            self._drop(next(iter(self._order)))
        if self.tokens > self.budget:  # one sequence longer than the budget: keep its tail
            sid = next(iter(self._order))
            cut = self.tokens - self.budget
            self.seqs[sid] = self.seqs[sid][cut:]
            self.tokens -= cut
        self._rebuild()

    def _rebuild(self) -> None:
        self.index = _Index()
        for sid in self._order:
            self.index.add(sid, self.seqs[sid])
        self.stale = 0

    def propose(self, context: Sequence[int], limit: int, *, factor: float, min_prob: float, nodes: int = 0):
        """(draft, score, match length, tree or None); the sequences that voted count as used (LRU)."""
        toks, score, match, voters, tree = draft_from(
            context, self.index, self.seqs, limit, factor=factor, min_prob=min_prob, nodes=nodes
        )
        for sid in voters:
            self._order.move_to_end(sid)
        return toks, score, match, tree

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: Path, fingerprint: str) -> None:
        """Write atomically (a temporary file renamed over the old one). The temporary file's name
        carries this process's id, so one left by a process killed mid-save (kill -9) is known
        as stale and removed by the next save."""
        data = {
            "format": STORE_FORMAT,
            "version": STORE_VERSION,
            "tokenizer": fingerprint,
            "sequences": [self.seqs[sid] for sid in self._order],
        }
        path = Path(path)
        _remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=str(path.parent or Path("."))
        )
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # an ordinary file, not mkstemp's private one
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path, fingerprint: str, budget: int, vocab_size: int | None = None) -> SuffixStore:
        """Read a saved store; ValueError (with the reason) for a corrupt or foreign file. Token ids
        are checked against the vocabulary: a draft is fed to the model, whose embedding lookup
        does no bounds check."""
        try:
            # the largest store within the budget: a token id is at most 12 characters of JSON
            data = json.loads(read_text(path, budget * 12 + MIB))
        except UnreadableFile as exc:
            raise ValueError(str(exc)) from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict) or data.get("format") != STORE_FORMAT:
            raise ValueError(f'not an mlxcel suffix store (no "format": "{STORE_FORMAT}")')
        if data.get("version") != STORE_VERSION:
            raise ValueError(f"store version {data.get('version')!r}; this mlxcel-py reads version {STORE_VERSION}")
        if data.get("tokenizer") != fingerprint:
            raise ValueError("it was saved for another tokenizer, so its token ids mean other text here")
        seqs = data.get("sequences")
        top = vocab_size if vocab_size else 1 << 62
        if not isinstance(seqs, list) or not all(
            isinstance(s, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < top for t in s)
            for s in seqs
        ):
            raise ValueError(
                '"sequences" must be a list of lists of token ids'
                + (f" below the vocabulary size ({vocab_size})" if vocab_size else "")
            )
        store = cls(budget)
        for s in seqs:
            store.add(s)
        return store


def fingerprint(vocab: dict[str, int] | None, vocab_size: int | None) -> str:
    """Names a tokenizer by its size and a hash of its vocabulary (stable across runs)."""
    import hashlib

    h = hashlib.sha256()
    for tok, i in sorted((vocab or {}).items(), key=lambda kv: kv[1]):
        h.update(f"{i}\t{tok}\n".encode("utf-8", "surrogatepass"))
    return f"{vocab_size}:{h.hexdigest()[:16]}"


class SuffixDrafter(Drafter):
    """Per request: an index over the live context; shared: the engine's SuffixStore."""

    kind = "suffix"

    def __init__(
        self,
        store: SuffixStore,
        *,
        factor: float = DEFAULT_MAX_SPEC_FACTOR,
        min_prob: float = DEFAULT_MIN_TOKEN_PROB,
        eos_ids: Iterable[int] = (),
    ):
        self.store = store
        self.factor = factor
        self.min_prob = min_prob
        self.eos_ids = frozenset(eos_ids)
        self.live = _Index()
        self.tokens: list[int] = []

    def begin(self, context: Sequence[int], target=None) -> None:
        self.live = _Index()
        self.tokens = []
        self.commit(context)

    def commit(self, context: Sequence[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(context[start:])
        self.live.add(0, self.tokens, start)

    def shadow(self, limit: int) -> list[int]:
        return self._best(self.tokens, limit)[0]

    def _best(self, context: Sequence[int], limit: int, nodes: int = 0) -> tuple[list[int], int, DraftTree | None]:
        # the live context indexes only n-grams with a follower, so the suffix never matches itself
        live = draft_from(
            context, self.live, {0: self.tokens}, limit, factor=self.factor, min_prob=self.min_prob, nodes=nodes
        )
        live = (live[0], live[1], live[2], live[4])
        stored = self.store.propose(context, limit, factor=self.factor, min_prob=self.min_prob, nodes=nodes)
        toks, _, match, tree = max((live, stored), key=lambda r: (r[1], r[2]))
        return toks, match, tree

    def propose(self, context: Sequence[int], limit: int, decider) -> Proposal:
        self.commit(context)
        toks, match, _ = self._best(self.tokens, limit)
        return Proposal(stop_at_eos(toks, self.eos_ids, decider), match_len=match)

    def propose_tree(self, context: Sequence[int], limit: int, decider, nodes: int) -> Proposal:
        self.commit(context)
        toks, match, tree = self._best(self.tokens, limit, nodes)
        if tree is not None:
            tree = tree.ended(lambda t: t in self.eos_ids and not decider.ignore_eos)
        return Proposal(stop_at_eos(toks, self.eos_ids, decider), match_len=match, tree=tree)


class Source(DrafterSource):
    """assets: the SuffixStore (a new one of --suffix-cache-tokens when None), kept across requests."""

    def __init__(self, draft, **kw):
        super().__init__(draft, **kw)
        self.store = self.assets if self.assets is not None else SuffixStore(draft.suffix_cache_tokens)
        self.fingerprint: str | None = None  # the tokenizer the store belongs to (prepare sets it)

    def new_drafter(self) -> SuffixDrafter:
        return SuffixDrafter(self.store, eos_ids=self.eos_ids)

    def retarget(self, draft, loaded) -> Source:
        # a store is memory of requests, not a loaded asset: another configuration starts empty
        return Source(draft, model=loaded.model, eos_ids=self.eos_ids, vocab_size=self.vocab_size)

    def remember(self, tokens: Sequence[int]) -> None:
        self.store.add(tokens)

    def save(self) -> str | None:
        path = self.config.suffix_store
        if not path:
            return None
        where = Path(path).expanduser()
        try:
            self.store.save(where, self.fingerprint)
        except OSError as exc:
            raise ModelError(f"--suffix-store {path}: cannot write it ({exc.strerror})") from None
        return f"suffix store: {len(self.store)} sequences, {self.store.tokens} tokens saved to {where}"


def _remove_stale_temporaries(path: Path) -> None:
    """Temporary files of earlier saves to `path` whose process is gone (killed mid-save)."""
    for tmp in (path.parent or Path(".")).glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 :].split(".", 1)[0]
        if not whole_number(pid) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone: its save never finished
            tmp.unlink(missing_ok=True)
        except OSError:  # alive under another user (EPERM): its save may be under way
            pass


def prepare(draft, target, model_options) -> Plan:
    """A new store, or the one saved at --suffix-store, checked against the target's tokenizer
    before any weight loads."""
    from ..models.loading import load_tokenizer_only

    tok = load_tokenizer_only(target)
    fp = fingerprint(tok.get_vocab() if hasattr(tok, "get_vocab") else None, target.config.get("vocab_size"))
    store = _load_store(draft, fp, target.config.get("vocab_size"))

    def load(loaded, say) -> Source:
        src = Source.of(draft, loaded, store)
        src.fingerprint = fp
        if len(store):
            say(f"suffix store: {len(store)} sequences, {store.tokens} tokens from {draft.suffix_store}")
        return src

    return Plan(draft, load)


def _load_store(draft, fp: str, vocab_size: Any) -> SuffixStore:
    path = Path(draft.suffix_store).expanduser() if draft.suffix_store else None
    if path is None or not path.exists():
        return SuffixStore(draft.suffix_cache_tokens)
    try:
        return SuffixStore.load(path, fp, draft.suffix_cache_tokens, vocab_size)
    except ValueError as exc:
        raise ModelError(
            f"--suffix-store {draft.suffix_store}: {exc}", hint="delete the file or pass another --suffix-store path"
        ) from None
    except OSError as exc:
        raise ModelError(f"--suffix-store {draft.suffix_store}: cannot read it ({exc.strerror})") from None
