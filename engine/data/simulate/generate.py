"""The simulator's entry points: :func:`simulate`, CSV writing, the per-kind summary and the CLI ``main``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from engine.data.simulate.card import _Card, _concat, _episode, _take
from engine.data.simulate.world import (
    _KIND_CODE,
    _KIND_NAMES,
    _METROS,
    CHIP_NAMES,
    COLUMNS,
    COMPROMISE_DELAY_DAYS,
    EPISODE_CARD_SHARE,
    EPISODE_KINDS,
    FRAUD_KINDS,
    MIN_DAYS,
    MIN_HISTORY,
    _World,
)

# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def simulate(customers: int = 400, seed: int = 7, start="2023-01-01", days: int = 365,
             shared_compromise: int = 0) -> pd.DataFrame:
    """Simulate ``customers`` customers' card transactions over ``days`` days from ``start``.

    Returns a frame with :data:`COLUMNS` (TabFormer's 15 columns plus ``Fraud Episode`` and
    ``Fraud Kind``), one row per transaction, ordered by User, Card, time. Text columns hold the
    exact TabFormer text (``"$-25.00"``, ``"06:21"``, ``"91750.0"``); User, Card, Year, Month,
    Day, Merchant Name and MCC are int64. The fraud rules are in the module docstring. The result
    depends only on the arguments: the same arguments give an identical frame (and CSV).

    ``start`` is a date (``"2023-01-01"`` or anything :class:`pandas.Timestamp` accepts; the
    time of day is ignored); ``days`` must be at least 28.

    ``shared_compromise`` (default 0: off, the output is unchanged): a common point of compromise.
    For each ``compromised_merchant`` episode, up to this many other cards without an episode
    (same home state first) also swipe at the compromised store within 3 days of the card's visit
    (that visit is their episode's cause) and get their own counterfeit episode 7-30 days later;
    drawn from a fourth random stream, so everything else stays as without it.
    """
    customers = int(customers)
    days = int(days)
    if customers < 1:
        raise ValueError("customers must be >= 1")
    if days < MIN_DAYS:
        raise ValueError(f"days must be >= {MIN_DAYS}")
    day0 = np.datetime64(pd.Timestamp(start).date(), "D")
    day_arr = day0 + np.arange(days)
    dom = (day_arr - day_arr.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64) + 1
    dow0 = int((day0.astype(np.int64) + 3) % 7)  # Monday = 0

    world_ss, cust_ss, fraud_ss, shared_ss = np.random.SeedSequence(int(seed)).spawn(4)
    world = _World(np.random.default_rng(world_ss))

    cards: list[tuple[int, int, _Card]] = []
    for user, ss in enumerate(cust_ss.spawn(customers)):
        rng = np.random.default_rng(ss)
        n_cards = int(rng.choice([1, 2, 3], p=[0.5, 0.35, 0.15]))
        metro = int(rng.choice(len(_METROS), p=world.metro_p))
        user_city = int(rng.choice(world.metro_cities[metro]))
        for c in range(n_cards):
            home = user_city if rng.random() < 0.85 else int(rng.choice(world.metro_cities[metro]))
            cards.append((user, c, _Card(rng, world, metro, home, days, dow0, dom)))

    # fraud episodes
    frng = np.random.default_rng(fraud_ss)
    lo_day = np.zeros(len(cards), np.int64)
    eligible = []
    for i, (_u, _c, card) in enumerate(cards):
        pos = np.sort(card.legit["ts"][card.legit["cents"] > 0])
        if len(pos) < MIN_HISTORY:
            continue
        lo_day[i] = max(int(math.ceil(0.1 * days)), int(pos[MIN_HISTORY - 1] // 1440) + 1)
        if lo_day[i] < days - 6:
            eligible.append(i)
    n_ep = min(len(eligible), max(1, int(round(EPISODE_CARD_SHARE * len(cards)))))
    chosen = np.sort(frng.choice(np.array(eligible, np.int64), n_ep, replace=False)) if n_ep else []
    kinds = frng.permutation(np.resize(np.array(EPISODE_KINDS, dtype=object), n_ep))

    blocks, users, card_nos = [], [], []
    fraud_by_card: dict[int, dict] = {}
    for e, (i, kind) in enumerate(zip(chosen, kinds), start=1):
        start_day = int(frng.integers(lo_day[i], days - 6))
        fraud_by_card[int(i)] = _episode(frng, world, cards[i][2], str(kind), start_day, e)
    if shared_compromise > 0:
        _share_compromises(np.random.default_rng(shared_ss), world, cards, fraud_by_card, eligible, lo_day,
                           days, int(shared_compromise), n_ep + 1)
    for i, (user, c, card) in enumerate(cards):
        b = _concat([card.legit, fraud_by_card[i]]) if i in fraud_by_card else card.legit
        blocks.append(b)
        users.append(np.full(len(b["ts"]), user, np.int64))
        card_nos.append(np.full(len(b["ts"]), c, np.int64))
    allr = _concat(blocks)
    user_a = np.concatenate(users)
    card_a = np.concatenate(card_nos)
    order = np.lexsort((np.arange(len(user_a)), allr["ts"], card_a, user_a))
    allr = _take(allr, order)
    user_a, card_a = user_a[order], card_a[order]
    return _to_frame(world, day0, user_a, card_a, allr)


def _share_compromises(rng, world: _World, cards, fraud_by_card: dict, eligible, lo_day, days: int, k: int,
                       next_episode: int) -> None:
    """Co-victims of each compromised store (``simulate(shared_compromise=k)``): adds episodes
    to ``fraud_by_card`` in place."""
    code = _KIND_CODE["compromised_merchant"]
    victims = [i for i, r in sorted(fraud_by_card.items()) if (r["kind"] == code).any()]
    e = next_episode
    for i in victims:
        r = fraud_by_card[i]
        v = int(np.flatnonzero(r["cause"] > 0)[0])
        t_v, mer, city, mcc = int(r["ts"][v]), r["merchant"][v], r["city"][v], r["mcc"][v]
        free = np.array([j for j in eligible if j not in fraud_by_card], np.int64)
        if not len(free):
            return
        same = free[[cards[j][2].home_state == cards[i][2].home_state for j in free]]
        pool = np.concatenate([rng.permutation(same), rng.permutation(np.setdiff1d(free, same))])
        n = 0
        for j in pool:
            if n == k:
                break
            t_j = max(0, t_v + int(rng.integers(-3 * 1440, 3 * 1440 + 1)))
            start = t_j // 1440 + int(rng.integers(COMPROMISE_DELAY_DAYS[0], COMPROMISE_DELAY_DAYS[1] + 1))
            if start >= days - 1 or t_j // 1440 < lo_day[j]:
                continue
            rows = _episode(rng, world, cards[j][2], "compromised_merchant", int(start), e)
            w = int(np.flatnonzero(rows["cause"] > 0)[0])
            rows["ts"][w], rows["merchant"][w], rows["city"][w], rows["mcc"][w] = t_j, mer, city, mcc
            fraud_by_card[int(j)] = rows
            e += 1
            n += 1


def _to_frame(world: _World, day0, user, card, r) -> pd.DataFrame:
    ts = r["ts"]
    dt = day0.astype("datetime64[m]") + ts
    months = dt.astype("datetime64[M]")
    year = months.astype(np.int64) // 12 + 1970
    month = months.astype(np.int64) % 12 + 1
    day = (dt.astype("datetime64[D]") - months.astype("datetime64[D]")).astype(np.int64) + 1
    mod = ts % 1440
    time_s = [f"{h:02d}:{m:02d}" for h, m in zip((mod // 60).tolist(), (mod % 60).tolist())]
    amount_s = [f"${'-' if c < 0 else ''}{abs(c) // 100}.{abs(c) % 100:02d}"
                for c in r["cents"].tolist()]
    city = r["city"]
    fraud = r["kind"] > 0
    # episode ids numbered in (User, Card) order of their first fraud row (co-victims of
    # ``shared_compromise`` are drawn after the others; without it the numbering is unchanged)
    firsts = pd.unique(r["episode"][r["episode"] > 0])
    renum = {int(e): i for i, e in enumerate(firsts.tolist(), start=1)}
    episode = [f"E{renum[e]:04d}" if e else "" for e in r["episode"].tolist()]
    cols = {
        "User": user, "Card": card, "Year": year, "Month": month, "Day": day,
        "Time": time_s, "Amount": amount_s, "Use Chip": CHIP_NAMES[r["chip"]],
        "Merchant Name": r["merchant"], "Merchant City": world.city_name[city],
        "Merchant State": world.city_state[city], "Zip": world.city_zip[city],
        "MCC": r["mcc"].astype(np.int64), "Errors?": r["err"],
        "Is Fraud?": np.where(fraud, "Yes", "No").astype(object),
        "Fraud Episode": episode, "Fraud Kind": _KIND_NAMES[r["kind"]],
        "Fraud Cause": [f"E{renum[e]:04d}" if e else "" for e in r["cause"].tolist()],
    }
    # text columns become pandas' default string dtype (``str`` in pandas 3, object before)
    df = pd.DataFrame({k: (np.asarray(v, dtype=object) if k in _TEXT_COLS else np.asarray(v, np.int64))
                       for k, v in cols.items()})
    return df[COLUMNS]


_TEXT_COLS = {"Time", "Amount", "Use Chip", "Merchant City", "Merchant State", "Zip", "Errors?",
              "Is Fraud?", "Fraud Episode", "Fraud Kind", "Fraud Cause"}


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The exact bytes :func:`write_csv` writes for ``df`` (UTF-8, ``\\n`` line ends, no index),
    through the one CSV writer (:func:`engine.data.csv_writer.csv_bytes`): a text cell that starts
    with a formula trigger is neutralised, every other cell is written as is (the simulator's own
    text never starts with one, so the demo CSV is unchanged)."""
    from engine.data.csv_writer import csv_bytes as _neutralised_csv_bytes

    return _neutralised_csv_bytes(df)


def write_csv(df: pd.DataFrame, path) -> Path:
    """Write a :func:`simulate` frame as a TabFormer CSV (header line, ``\\n`` line ends).

    Fields with a comma (``"Bad PIN,Insufficient Balance"``) are quoted, empty fields are
    empty. Parent directories are created. Returns the path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(csv_bytes(df))
    return path


def summarize(df: pd.DataFrame) -> dict:
    """Counts of a :func:`simulate` frame: rows, customers, cards, fraud rows, episodes, per kind.

    Returns ``{"rows", "customers", "cards", "cards_with_episode", "fraud_rows", "episodes",
    "fraud_rows_by_kind": {kind: n}, "episodes_by_kind": {primary kind: n},
    "episodes_with_refund", "first_day", "last_day"}``.
    """
    fraud = df[df["Is Fraud?"] == "Yes"]
    primary = fraud[fraud["Fraud Kind"] != "fraud_refund"].drop_duplicates("Fraud Episode")
    dates = pd.to_datetime(dict(year=df["Year"], month=df["Month"], day=df["Day"]))
    return {
        "rows": int(len(df)),
        "customers": int(df["User"].nunique()),
        "cards": int(len(df[["User", "Card"]].drop_duplicates())),
        "cards_with_episode": int(len(fraud[["User", "Card"]].drop_duplicates())),
        "fraud_rows": int(len(fraud)),
        "episodes": int(fraud["Fraud Episode"].nunique()),
        "fraud_rows_by_kind": {k: int((fraud["Fraud Kind"] == k).sum()) for k in FRAUD_KINDS},
        "episodes_by_kind": {k: int((primary["Fraud Kind"] == k).sum()) for k in EPISODE_KINDS},
        "episodes_with_refund": int((fraud["Fraud Kind"] == "fraud_refund").sum()),
        "first_day": str(dates.min().date()) if len(df) else "",
        "last_day": str(dates.max().date()) if len(df) else "",
    }


def main(customers: int = 400, seed: int = 7, out="demo_data/transactions.csv", shared_compromise: int = 0) -> str:
    """Simulate, write the CSV to ``out`` and return a one-line summary (what the CLI prints);
    ``shared_compromise`` as in :func:`simulate`."""
    df = simulate(customers=customers, seed=seed, shared_compromise=shared_compromise)
    path = write_csv(df, out)
    s = summarize(df)
    kinds = ", ".join(f"{k} {n}" for k, n in s["fraud_rows_by_kind"].items())
    return (f"wrote {path}: {s['rows']:,} rows, {s['customers']} customers, {s['cards']} cards, "
            f"{s['fraud_rows']} fraud rows ({100 * s['fraud_rows'] / max(s['rows'], 1):.2f}%) in "
            f"{s['episodes']} episodes on {s['cards_with_episode']} cards ({kinds}); "
            f"{path.stat().st_size:,} bytes")
