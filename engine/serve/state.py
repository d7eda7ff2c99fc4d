"""Per-entity scoring state of the service: the incremental scorer's caches in a bounded LRU.

Each cached entity holds the key/value caches of :class:`engine.model.incremental.IncrementalScorer`
(at most ``ceil(T / S)`` windows of ``[L, H, <=T, dh]`` float32 keys and values) plus the last
:data:`FACTS` transactions' time, amount and merchant-like value for the cheap reasons. The cache
is bounded by ``max_bytes``: per entity, the bytes of its arrays (keys, values, times, amounts,
first-seen codes), of its id's text and of its cached facts (each fact's tuple, number and
merchant objects, ``sys.getsizeof``: the text of a long id or merchant counts in full), plus a
fixed overhead (:data:`ENTITY_OVERHEAD`); the least recently used entity is dropped when the
total is over the cap.

While a request is scored (:meth:`EntityCache.holding`), the entities it touches are not evicted:
its rows are staged, not yet in the history store, so an entity dropped in the middle of it could
only be rebuilt without them. The cap may then be exceeded by at most the request's entities
(:data:`engine.serve.service.MAX_BATCH`) until the request ends.

A miss (an entity not in the cache: evicted, or the service restarted) is rebuilt from the
history store without re-scoring its whole history: the windows open after the entity's ``n``
transactions start at ``k * S`` for ``k * S > n - 1 - T``, and a window's caches depend only on
its own rows and the time of the row before it, so the rebuild replays the rows from the first
open window's start (at most ``T + S`` rows; the scores of the replayed rows are discarded).
``tests/engine/serve/test_service.py`` checks that scores after a rebuild equal uninterrupted scoring.
"""

from __future__ import annotations

import statistics
import sys
from collections import OrderedDict, deque
from contextlib import contextmanager
from typing import Any

from engine.model.checkpoint import ModelBundle
from engine.model.incremental import IncrementalScorer
from engine.serve.history import HistoryStore
from engine.trust.reasons import MEDIAN_MIN_PURCHASES

#: recent transactions kept per entity for the cheap reasons
FACTS = 50
#: bytes counted per cached entity besides its arrays, id and facts (dict entries, deque, window objects)
ENTITY_OVERHEAD = 2048
_TUPLE3 = sys.getsizeof((0, 0.0, None))
_NOVELTY_FIELDS = ("merchant", "terminal")


class EntityCache:
    """The incremental scorer's per-entity caches under a memory cap, rebuilt from history.

    Not thread-safe: the service calls it under one lock.

    Args:
        bundle: the loaded model.
        history: the history store (read on a miss).
        max_bytes: cap of the cached bytes (>= 1 entity is always kept).
    """

    def __init__(self, bundle: ModelBundle, history: HistoryStore, max_bytes: int):
        self.scorer = IncrementalScorer(bundle)
        self.history = history
        self.max_bytes = int(max_bytes)
        cfg = bundle.config
        self.T, self.S = cfg.context_length, cfg.context_length - cfg.min_history
        self.sizes: OrderedDict[str, int] = OrderedDict()  # entity -> bytes, least recently used first
        self.facts: dict[str, deque] = {}
        self.fact_bytes: dict[str, int] = {}  # entity -> bytes of its facts (kept as facts come and go)
        self.bytes = 0
        self.held: set[str] | None = None  # entities of the request being scored (:meth:`holding`)
        self.hits = self.misses = self.evictions = 0
        self.before_rebuild = lambda: None  # the service waits for in-flight commits here
        names = {f.name for f in bundle.spec.fields}
        self.novelty = next((n for n in _NOVELTY_FIELDS if n in names), None)
        self.noun = _entity_noun(bundle.spec)  # "card" / "customer" / "account"

    # ------------------------------------------------------------------ cache
    def _size(self, entity_id: str) -> int:
        """Bytes held for ``entity_id``: arrays + id text + facts + :data:`ENTITY_OVERHEAD`."""
        st = self.scorer.entities.get(entity_id)
        arrays = 0 if st is None else sum(w.keys.nbytes + w.values.nbytes + w.times.nbytes + w.zs.nbytes
                                          + w.cats.nbytes for w in st.windows)
        return arrays + ENTITY_OVERHEAD + sys.getsizeof(entity_id) + self.fact_bytes.get(entity_id, 0)

    def _push_fact(self, entity_id: str, facts: deque, fact: tuple) -> None:
        """Append ``fact`` to the entity's bounded deque, keeping :attr:`fact_bytes` exact."""
        b = self.fact_bytes.get(entity_id, 0) + _fact_size(fact)
        if len(facts) == facts.maxlen:
            b -= _fact_size(facts[0])
        facts.append(fact)
        self.fact_bytes[entity_id] = b

    def _account(self, entity_id: str) -> None:
        new = self._size(entity_id)
        self.bytes += new - self.sizes.get(entity_id, 0)
        self.sizes[entity_id] = new
        self.sizes.move_to_end(entity_id)
        self._shrink()

    def _shrink(self) -> None:
        """Evict least recently used entities until the cap holds (>= 1 kept); a held entity
        (:meth:`holding`) is in use, so it counts as recent instead (moved to the end)."""
        moved = 0
        held = self.held or ()
        while self.bytes > self.max_bytes and len(self.sizes) > 1:
            old = next(iter(self.sizes))
            if old in held:
                if moved >= len(held):  # every entity left is held: over the cap until the request ends
                    return
                self.sizes.move_to_end(old)
                moved += 1
                continue
            self.evict(old)
            self.evictions += 1

    @contextmanager
    def holding(self):
        """Within the block, entities loaded (:meth:`ensure`, which every scoring call follows) are not evicted (the rows a request stages
        are not in the history store yet, so a rebuild would miss them); at its end the cap is
        enforced again. Not reentrant.

        Raises:
            RuntimeError: already inside a ``holding`` block.
        """
        if self.held is not None:
            raise RuntimeError("EntityCache.holding is not reentrant")
        self.held = set()
        try:
            yield
        finally:
            self.held = None
            self._shrink()

    def evict(self, entity_id: str) -> None:
        """Drop an entity's caches (rebuilt from history when it is next scored)."""
        self.bytes -= self.sizes.pop(entity_id, 0)
        self.scorer.entities.pop(entity_id, None)
        self.facts.pop(entity_id, None)
        self.fact_bytes.pop(entity_id, None)

    def ensure(self, entity_id: str) -> bool:
        """Load ``entity_id``'s caches (from history on a miss); True on a cache hit."""
        if self.held is not None:
            self.held.add(entity_id)
        if entity_id in self.sizes:
            self.hits += 1
            self.sizes.move_to_end(entity_id)
            return True
        self.misses += 1
        self.before_rebuild()
        self.rebuild(entity_id)
        return False

    def rebuild(self, entity_id: str) -> int:
        """Rebuild an entity's caches from the history store; returns the rows replayed."""
        self.scorer.entities.pop(entity_id, None)
        n = self.history.count(entity_id)
        facts: deque = deque(maxlen=FACTS)
        self.facts[entity_id] = facts
        self.fact_bytes[entity_id] = 0
        if n == 0:
            self._account(entity_id)
            return 0
        start = max(0, (n - 1 - self.T) // self.S + 1) * self.S  # first window still open after n rows
        off = max(0, min(start - 1, n - FACTS))
        rows = self.history.entity_rows(entity_id, off)
        for r in rows[max(0, n - FACTS - off):]:
            self._push_fact(entity_id, facts, self._fact(r))
        prev = rows[start - 1 - off]["ts_ns"] / 1e9 if start > 0 else None  # as FeatureEncoder.transform_row's time_s
        replay = rows[start - off:]
        try:
            self.scorer.resume(entity_id, replay, start, prev)
        except Exception:
            self.evict(entity_id)
            raise
        self._account(entity_id)
        return len(replay)

    def last_time_ns(self, entity_id: str) -> int | None:
        """The entity's last accepted timestamp (ns), None for a new entity; loads it first."""
        self.ensure(entity_id)
        f = self.facts[entity_id]
        return f[-1][0] if f else None

    # ------------------------------------------------------------------ scoring
    def _fact(self, row: dict[str, Any]) -> tuple:
        return (int(row["ts_ns"]), float(row["amount"]), row.get(self.novelty) if self.novelty else None)

    def score(self, entity_id: str, row: dict[str, Any]) -> tuple[float, list[dict[str, str]]]:
        """Score one transaction appended to ``entity_id``'s history (call :meth:`ensure` first).

        Returns:
            ``(logit, reasons)``; reasons are computed from the entity's previous transactions
            (see :func:`cheap_reasons`).
        Raises:
            ValueError: older than the entity's previous transaction.
            NonFiniteScoreError: NaN / infinite logit (the entity is evicted, rebuilt on next use).
        """
        facts = self.facts.setdefault(entity_id, deque(maxlen=FACTS))
        try:
            logit = self.scorer.add(entity_id, row)
        except Exception:
            self.evict(entity_id)
            raise
        reasons = cheap_reasons(row, list(facts), self.novelty, self.noun)
        self._push_fact(entity_id, facts, self._fact(row))
        self._account(entity_id)
        return logit, reasons

    def score_many(self, items: list[tuple[str, dict[str, Any]]]) -> list[tuple[float, list[dict[str, str]]]]:
        """:meth:`score` for one transaction of each of several distinct entities (each loaded with
        :meth:`ensure` first), scored together (:meth:`IncrementalScorer.add_many`); returns one
        ``(logit, reasons)`` per item. On any error every item's entity is evicted (rebuilt from
        the history store on its next use) and the error propagates. Call it inside
        :meth:`holding` (or with a cap above the items' entities): each item's bookkeeping may
        otherwise evict a later item's entity."""
        facts = [self.facts.setdefault(e, deque(maxlen=FACTS)) for e, _ in items]
        try:
            logits = self.scorer.add_many(items)
        except Exception:
            for e, _ in items:
                self.evict(e)
            raise
        out = []
        for (e, row), f, logit in zip(items, facts, logits):
            out.append((float(logit), cheap_reasons(row, list(f), self.novelty, self.noun)))
            self._push_fact(e, f, self._fact(row))
            self._account(e)
        return out

    def stats(self) -> dict[str, int]:
        return {"entities": len(self.sizes), "bytes": self.bytes, "max_bytes": self.max_bytes, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions}


def _fact_size(fact: tuple) -> int:
    """Bytes of one cached fact ``(ts_ns, amount, merchant-like value)``: the tuple and its objects."""
    return _TUPLE3 + sys.getsizeof(fact[0]) + sys.getsizeof(fact[1]) + (0 if fact[2] is None else sys.getsizeof(fact[2]))


def cheap_reasons(row: dict[str, Any], previous: list[tuple], novelty: str | None, noun: str) -> list[dict[str, str]]:
    """Short facts about one transaction against the entity's previous ones (at most :data:`FACTS`).

    Every reason is a fact of the data, never of the model: ``first_transaction`` (no earlier
    transaction), ``amount`` (a purchase at least 3x the median of the entity's previous >=
    :data:`~engine.trust.reasons.MEDIAN_MIN_PURCHASES` (5) purchases, the case reasons' rule),
    ``new_<merchant|terminal>`` (value absent from the previous >= 5 transactions),
    ``burst`` (>= 3 transactions, this one included, within one hour), ``errors`` (authorisation
    errors on this transaction). Attribution-based reasons (:mod:`engine.trust.reasons`) need an
    explanation and are computed off the hot path with the case.

    Returns:
        ``[{"code", "text"}]``; amounts in the spec's currency; ``noun`` names the entity ("card").
    """
    out: list[dict[str, str]] = []
    if not previous:
        return [{"code": "first_transaction", "text": f"first transaction of this {noun}"}]
    amount, ts = float(row["amount"]), int(row["ts_ns"])
    buys = [a for _, a, _ in previous if a > 0]
    if amount > 0 and len(buys) >= MEDIAN_MIN_PURCHASES:
        med = statistics.median(buys)
        if med > 0 and amount >= 3 * med:
            out.append({"code": "amount", "text": f"amount {amount:,.2f} is {amount / med:.1f}x the {noun}'s median "
                        f"{med:,.2f} over its last {len(buys)} purchases"})
    if novelty is not None and len(previous) >= 5:
        v = row.get(novelty)
        if v not in {x for _, _, x in previous}:
            out.append({"code": f"new_{novelty}", "text": f"{novelty} {v} not seen in the {noun}'s last "
                        f"{len(previous)} transactions"})
    recent = sum(1 for t, _, _ in previous if ts - t <= 3600 * 10**9) + 1
    if recent >= 3:
        out.append({"code": "burst", "text": f"{recent} transactions within one hour"})
    errs = row.get("errors")
    if isinstance(errs, str) and errs:
        out.append({"code": "errors", "text": f"authorisation errors: {errs.replace('|', ', ')}"})
    return out


def _entity_noun(spec) -> str:
    from engine.trust.reasons import _entity_noun as noun

    return noun(spec)

