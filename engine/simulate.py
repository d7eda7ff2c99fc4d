"""Seeded simulator of credit-card transactions in the IBM TabFormer format, with labelled fraud.

``simulate(customers, seed, start, days)`` returns a :class:`pandas.DataFrame` whose columns and
text formats are exactly those of TabFormer's ``card_transaction.v1.csv`` (see
``shared/data/tabformer/SOURCE.md``) plus two evaluation-only columns::

    User,Card,Year,Month,Day,Time,Amount,Use Chip,Merchant Name,Merchant City,Merchant State,
    Zip,MCC,Errors?,Is Fraud?,Fraud Episode,Fraud Kind

``Fraud Episode`` (``"E0007"``) and ``Fraud Kind`` are empty on legitimate rows. They are ground
truth for evaluation and explanation checks and must never be model input. ``write_csv`` writes
the frame byte-reproducibly; ``main`` is what ``fraudlens simulate`` calls. The same arguments
always give a byte-identical CSV (every random draw comes from a ``numpy.random.Generator``
seeded from ``seed`` through ``numpy.random.SeedSequence``; nothing depends on the clock,
hashing or the platform).

Text formats (as in the real file)
----------------------------------
Amount ``"$134.09"`` / ``"$-25.00"`` (negative = refund); Time ``"HH:MM"``; Zip float text
``"91750.0"`` (Boston's 02108 is ``"2108.0"``), empty for online purchases; Merchant City
``"ONLINE"`` and empty Merchant State for online purchases; Use Chip one of ``Swipe
Transaction``, ``Chip Transaction``, ``Online Transaction``; Merchant Name a signed 64-bit
integer; MCC a real merchant category code; Errors? empty or a comma-separated list in
alphabetical order (written in quotes by the CSV writer when it has a comma); Is Fraud?
``Yes``/``No``. Rows are ordered by User, Card, then time (ties in generation order).

Legitimate behaviour (per card)
-------------------------------
* Customers are numbered ``0..customers-1`` and each has 1-3 cards (probabilities .5/.35/.15),
  numbered from 0. A customer lives in one of 22 US metro areas (real city names and zip codes);
  each card has a home city in that metro.
* A card has regular merchants: for each store category (grocery 5411, drug store 5912, gas
  5541, restaurants 5812, fast food 5814, ...) it has one or a few merchants with probability
  ``p_has`` of the category, mostly in the home city and otherwise in another city of the metro;
  likewise online merchants (digital media 5815, online department stores 5311, ...).
  Merchants are shared by all cards of a city (one merchant id per store), so a merchant id alone
  says nothing about fraud. Each merchant has a typical amount (category median times a
  lognormal(0, 0.3) factor); a purchase costs typical * lognormal(0, sigma of the category).
* Discretionary purchases per day ~ Gamma(3, mean 0.12) per card; the count over the window is
  Poisson. The day is drawn with the card's weekly rhythm (a Gamma(5, 1) weight per weekday, the
  weekend scaled by U(0.6, 1.8)); the hour comes from the card's daily rhythm: 2-4 peak hours,
  each merchant tied to one peak, normal noise with a per-card sd of U(0.3, 1.4) h, and 8 % of
  purchases at a uniform hour 06:00-23:00.
* Monthly bills (utilities 4900, telecom 4814, cable/streaming 4899, insurance 6300) are charged
  online on a fixed day of the month; streaming and insurance at the same amount every month.
* Trips: Poisson(0.7 per year) trips of 2-6 days to a metro in another state. During a trip the
  card's home in-person purchases stop and it is used in the destination (restaurants, gas,
  taxis, a hotel charged at checkout); an airline ticket is bought online 7-45 days before. Trips
  make "new merchant in another state" a poor single-row fraud signal.
* Refunds: each non-bill purchase is refunded with a per-card probability U(0.005, 0.025), 1-21
  days later, at the same merchant/channel, for exactly minus the purchase amount.
* Use Chip: online purchases are ``Online Transaction``; in-person ones are ``Chip
  Transaction`` with a per-card probability U(0.2, 0.9), else ``Swipe Transaction``.
* Errors?: per row, independently: Insufficient Balance with a per-card rate in
  {0.002, 0.01, 0.04} (p .5/.35/.15), Technical Glitch 0.0025, Bad PIN 0.002 (in person only),
  Bad Expiration 0.0005, Bad Card Number 0.0002, Bad CVV 0.0005 (online only). Refunds carry none.

Fraud episodes (exact generative rules)
---------------------------------------
``round(0.055 * number_of_cards)`` cards (at least 1) get exactly one episode each; the cards are
drawn uniformly among *eligible* ones (at least 8 legitimate purchases before the earliest
possible start, which is day ``max(0.1 * days, day after the 8th purchase)``; latest start day
``days - 6``). The kinds are assigned as evenly as possible (a shuffled round-robin of the
three primary kinds); episodes are numbered ``E0001``, ``E0002``, ... in (User, Card) order. The
start day is uniform in the card's allowed range. "The card's median" below is the median of the
card's legitimate purchase amounts (positive amounts) before the episode start; "new merchant"
means a merchant the card never uses legitimately in the whole window; "new MCC" an MCC it
never uses legitimately.

1. ``card_testing``: start at a uniform minute of the day, 50 % of the time in 00:00-06:00.
   3-8 tiny online charges of U{$0.50..$3.00}, 1-3 minutes apart, each at a different new
   merchant in a small-ticket online category (5815, 5816, 5999, 5734, 4829); each carries
   ``Bad CVV``/``Bad Expiration``/``Bad Card Number`` with probability 0.25. Then 1-2 large
   online purchases, each 5-60 minutes after the previous charge, of exp(U(ln 200, ln 1500))
   dollars at new merchants in 5732/5311/5944/5045. Whole burst spans at most 2 h 21 min.
2. ``account_takeover``: start at a uniform minute in 08:00-23:00; 4-10 online purchases 3-25
   minutes apart (so within 3 h 45 min), each amount ``ceil(median * U(3, 8))`` to the cent
   (so always >= 3x the card's median), each MCC drawn from the high-resale categories the card
   never used (5732 electronics, 5944 jewelry, 5947 gift cards, 5045 computers, 5094 precious
   stones, 5946 cameras) at a new online merchant; Insufficient Balance with probability 0.1.
3. ``skimmed_card``: 2-4 cities in distinct states, none the card's home state nor a state it
   visits on a trip; the first city at a uniform minute in 09:00-20:00, each next city 3-14 h
   after the previous one's first purchase (physically impossible travel), 2-4 swipe purchases
   per city 5-60 minutes apart at that city's stores (new merchants) in 5411, 5912, 5541, 5310,
   5311, 5732, 5944, 5300; amount ``max(1.5 * median, 40) * lognormal(0, 0.5)``, at most $1500;
   ``Bad PIN`` with probability 0.1. Whole episode spans at most 45 h.
4. ``fraud_refund``: with probability 1/3 an episode of kind 1-3 also gets one refund of one of
   its charges (uniform among those >= $5, else among all): same merchant, city and channel,
   amount exactly minus the charge, 3 hours to 4 days after it. Labelled fraud, same episode id,
   kind ``fraud_refund``.

Every fraud row has ``Is Fraud?`` = Yes, its episode id and its kind; legit rows have ``No`` and
empty episode/kind. Legitimate activity of the card goes on unchanged around an episode, which
is what makes episodes visible in the sequence (sudden new channel, place, MCC, amount scale).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "COLUMNS",
    "TABFORMER_COLUMNS",
    "EXTRA_COLUMNS",
    "EPISODE_KINDS",
    "FRAUD_KINDS",
    "simulate",
    "write_csv",
    "csv_bytes",
    "summarize",
    "main",
]

TABFORMER_COLUMNS = [
    "User", "Card", "Year", "Month", "Day", "Time", "Amount", "Use Chip", "Merchant Name",
    "Merchant City", "Merchant State", "Zip", "MCC", "Errors?", "Is Fraud?",
]
EXTRA_COLUMNS = ["Fraud Episode", "Fraud Kind"]
COLUMNS = TABFORMER_COLUMNS + EXTRA_COLUMNS

EPISODE_KINDS = ("card_testing", "account_takeover", "skimmed_card")
FRAUD_KINDS = EPISODE_KINDS + ("fraud_refund",)

EPISODE_CARD_SHARE = 0.055
FRAUD_REFUND_PROB = 1.0 / 3.0
MIN_HISTORY = 8
MIN_DAYS = 28

CHIP_NAMES = np.array(["Swipe Transaction", "Chip Transaction", "Online Transaction"], dtype=object)
_SWIPE, _CHIP, _ONLINE = 0, 1, 2

# ---------------------------------------------------------------------------------------------
# World: metros (real cities and zip codes), categories, merchant pools
# ---------------------------------------------------------------------------------------------

# (state, home weight, [(city, zip), ...])
_METROS = [
    ("CA", 3.0, [("La Verne", 91750), ("Monterey Park", 91754), ("Pasadena", 91101),
                 ("Pomona", 91766), ("Claremont", 91711), ("Ontario", 91761)]),
    ("CA", 2.0, [("San Francisco", 94103), ("Oakland", 94607), ("Berkeley", 94704),
                 ("Daly City", 94014), ("San Mateo", 94401)]),
    ("CA", 1.0, [("San Diego", 92101), ("Chula Vista", 91910), ("La Mesa", 91941),
                 ("El Cajon", 92020)]),
    ("NY", 3.0, [("New York", 10001), ("Brooklyn", 11201), ("Bronx", 10451),
                 ("Yonkers", 10701), ("Staten Island", 10301)]),
    ("IL", 2.0, [("Chicago", 60601), ("Evanston", 60201), ("Oak Park", 60302),
                 ("Cicero", 60804), ("Skokie", 60076)]),
    ("TX", 1.5, [("Houston", 77002), ("Pasadena", 77506), ("Sugar Land", 77478),
                 ("Katy", 77494), ("Pearland", 77581)]),
    ("TX", 1.5, [("Dallas", 75201), ("Irving", 75061), ("Plano", 75074), ("Garland", 75040),
                 ("Arlington", 76010)]),
    ("FL", 1.5, [("Miami", 33130), ("Hialeah", 33010), ("Coral Gables", 33134),
                 ("Miami Beach", 33139)]),
    ("FL", 1.0, [("Orlando", 32801), ("Kissimmee", 34741), ("Winter Park", 32789)]),
    ("WA", 1.0, [("Seattle", 98101), ("Bellevue", 98004), ("Redmond", 98052),
                 ("Tacoma", 98402), ("Renton", 98057)]),
    ("GA", 1.0, [("Atlanta", 30303), ("Decatur", 30030), ("Marietta", 30060),
                 ("Smyrna", 30080)]),
    ("MA", 1.0, [("Boston", 2108), ("Cambridge", 2139), ("Somerville", 2143),
                 ("Quincy", 2169)]),
    ("AZ", 1.0, [("Phoenix", 85004), ("Tempe", 85281), ("Mesa", 85201),
                 ("Scottsdale", 85251), ("Glendale", 85301)]),
    ("CO", 1.0, [("Denver", 80202), ("Aurora", 80010), ("Lakewood", 80226),
                 ("Boulder", 80302)]),
    ("PA", 1.0, [("Philadelphia", 19103), ("Upper Darby", 19082), ("Norristown", 19401),
                 ("Chester", 19013)]),
    ("MN", 1.0, [("Minneapolis", 55401), ("Saint Paul", 55101), ("Bloomington", 55420),
                 ("Edina", 55424)]),
    ("OH", 1.0, [("Columbus", 43215), ("Dublin", 43017), ("Westerville", 43081),
                 ("Grove City", 43123)]),
    ("NV", 0.7, [("Las Vegas", 89101), ("Henderson", 89002), ("North Las Vegas", 89030)]),
    ("MI", 1.0, [("Detroit", 48226), ("Dearborn", 48124), ("Warren", 48089),
                 ("Livonia", 48150)]),
    ("NC", 1.0, [("Charlotte", 28202), ("Concord", 28025), ("Gastonia", 28052),
                 ("Matthews", 28105)]),
    ("OR", 0.8, [("Portland", 97204), ("Beaverton", 97005), ("Gresham", 97030),
                 ("Hillsboro", 97123)]),
    ("TN", 0.8, [("Nashville", 37203), ("Franklin", 37064), ("Murfreesboro", 37130)]),
]

# In-person categories: mcc, p_has, max merchants, visit weight, median $, sigma, refundable
_STORE_CATS = [
    (5411, 0.95, 3, 5.0, 55.0, 0.60, True),   # grocery stores, supermarkets
    (5912, 0.80, 2, 2.5, 35.0, 0.70, True),   # drug stores, pharmacies
    (5300, 0.50, 1, 1.5, 110.0, 0.50, True),  # wholesale clubs
    (5541, 0.85, 2, 2.5, 42.0, 0.35, False),  # service stations
    (5311, 0.60, 2, 1.0, 75.0, 0.70, True),   # department stores
    (5812, 0.80, 4, 2.0, 38.0, 0.60, False),  # restaurants
    (5814, 0.80, 3, 2.5, 12.0, 0.50, False),  # fast food
    (5499, 0.50, 2, 1.5, 18.0, 0.60, False),  # misc food stores
    (5942, 0.25, 1, 0.5, 28.0, 0.60, True),   # book stores
    (7538, 0.35, 1, 0.3, 180.0, 0.70, False), # auto service shops
    (5310, 0.45, 2, 1.2, 40.0, 0.70, True),   # discount stores
    (7230, 0.45, 1, 0.5, 35.0, 0.40, False),  # barber and beauty shops
    (5211, 0.30, 1, 0.4, 85.0, 0.90, True),   # lumber and building materials
    (7832, 0.35, 1, 0.4, 26.0, 0.40, False),  # motion picture theaters
    (5651, 0.45, 2, 0.6, 65.0, 0.70, True),   # family clothing stores
    (5813, 0.35, 2, 0.8, 32.0, 0.60, False),  # bars, taverns
    (5719, 0.20, 1, 0.25, 120.0, 0.80, True), # home furnishing specialty
    (5970, 0.15, 1, 0.3, 30.0, 0.70, True),   # artist and craft supply
    (7210, 0.20, 1, 0.8, 15.0, 0.40, False),  # laundry services
    (7542, 0.30, 1, 0.5, 18.0, 0.30, False),  # car washes
    (5921, 0.30, 1, 0.6, 30.0, 0.50, False),  # liquor stores
    (5251, 0.35, 1, 0.4, 35.0, 0.80, True),   # hardware stores
    (5732, 0.25, 1, 0.2, 140.0, 0.90, True),  # electronics stores
    (5193, 0.15, 1, 0.2, 55.0, 0.50, False),  # florists
    (5944, 0.05, 1, 0.1, 220.0, 0.80, True),  # jewelry stores
    (4121, 0.10, 1, 0.4, 22.0, 0.50, False),  # taxicabs and limousines
]
# Online categories: mcc, p_has, max merchants, visit weight, median $, sigma, refundable
_ONLINE_CATS = [
    (5815, 0.40, 2, 0.6, 4.0, 0.70, False),   # digital media (small tickets)
    (5816, 0.15, 1, 0.4, 6.0, 0.80, False),   # digital games
    (5311, 0.35, 2, 0.5, 60.0, 0.80, True),   # department stores
    (5942, 0.20, 1, 0.3, 25.0, 0.60, True),   # book stores
    (4829, 0.20, 1, 0.3, 120.0, 0.80, False), # money transfer
    (5732, 0.15, 1, 0.15, 150.0, 0.90, True), # electronics
    (5947, 0.08, 1, 0.15, 45.0, 0.60, True),  # gift, card, novelty
    (5045, 0.06, 1, 0.1, 180.0, 0.80, True),  # computers and peripherals
    (5946, 0.04, 1, 0.1, 160.0, 0.80, True),  # camera and photo supply
    (5094, 0.03, 1, 0.1, 250.0, 0.80, True),  # precious stones and metals, watches, jewelry
    (5999, 0.10, 1, 0.3, 30.0, 0.80, True),   # misc retail
    (4722, 0.10, 1, 0.1, 350.0, 0.60, False), # travel agencies
]
# Monthly bills (online): mcc, p_has, median $, monthly sigma
_BILLS = [
    (4900, 0.25, 95.0, 0.25),  # utilities
    (4814, 0.30, 70.0, 0.10),  # telecommunication services
    (4899, 0.30, 45.0, 0.00),  # cable, satellite, streaming
    (6300, 0.10, 130.0, 0.00), # insurance
]
# Trips: in-person categories used at the destination (mcc, weight, median $, sigma)
_TRIP_CATS = [
    (5812, 0.35, 45.0, 0.6), (5814, 0.20, 14.0, 0.5), (5541, 0.15, 45.0, 0.35),
    (5499, 0.10, 20.0, 0.6), (4121, 0.10, 28.0, 0.5), (5311, 0.05, 70.0, 0.7),
    (7832, 0.05, 30.0, 0.4),
]
_HOTEL_MCC = 7011
_AIRLINE_MCCS = (3001, 3005, 3007, 3009, 3058)

# Fraud categories
_TEST_TINY_MCCS = (5815, 5816, 5999, 5734, 4829)
_TEST_LARGE_MCCS = (5732, 5311, 5944, 5045)
_ATO_MCCS = (5732, 5944, 5947, 5045, 5094, 5946)
_SKIM_MCCS = (5411, 5912, 5541, 5310, 5311, 5732, 5944, 5300)

_STORE_POOL_MCCS = sorted({c[0] for c in _STORE_CATS} | {c[0] for c in _TRIP_CATS}
                          | {_HOTEL_MCC} | set(_SKIM_MCCS))
_ONLINE_POOL_MCCS = sorted({c[0] for c in _ONLINE_CATS} | {b[0] for b in _BILLS}
                           | set(_AIRLINE_MCCS) | set(_TEST_TINY_MCCS)
                           | set(_TEST_LARGE_MCCS) | set(_ATO_MCCS))

_PEAK_HOURS = np.array([7.0, 9.5, 12.5, 15.0, 17.5, 19.5, 21.5])
_RATE_MEAN = 0.12        # discretionary purchases per card-day (Gamma(3, _RATE_MEAN / 3))
_TRIPS_PER_YEAR = 0.7
_ERR_FIXED = [  # name, probability, applies to: 0 = in person only, 1 = online only, 2 = all
    ("Bad Card Number", 0.0002, 2),
    ("Bad CVV", 0.0005, 1),
    ("Bad Expiration", 0.0005, 2),
    ("Bad PIN", 0.002, 0),
    ("Technical Glitch", 0.0025, 2),
]
_INSUFFICIENT_RATES = np.array([0.002, 0.01, 0.04])
_KIND_CODE = {k: i + 1 for i, k in enumerate(FRAUD_KINDS)}
_KIND_NAMES = np.array([""] + list(FRAUD_KINDS), dtype=object)
_INT64 = np.iinfo(np.int64)


class _World:
    """Cities and shared merchant pools (one merchant id per store), drawn from the world seed."""

    def __init__(self, rng: np.random.Generator):
        names, states, zips, metro = [], [], [], []
        self.metro_cities: list[np.ndarray] = []
        for m, (state, _w, cities) in enumerate(_METROS):
            idx = []
            for name, z in cities:
                idx.append(len(names))
                names.append(name)
                states.append(state)
                zips.append(f"{float(z):.1f}")
                metro.append(m)
            self.metro_cities.append(np.array(idx))
        self.city_name = np.array(names + ["ONLINE"], dtype=object)  # index -1 = ONLINE
        self.city_state = np.array(states + [""], dtype=object)
        self.city_zip = np.array(zips + [""], dtype=object)
        self.metro_state = np.array([m[0] for m in _METROS], dtype=object)
        w = np.array([m[1] for m in _METROS])
        self.metro_p = w / w.sum()
        n_city = len(names)

        store_counts = rng.integers(2, 7, size=(n_city, len(_STORE_POOL_MCCS)))
        online_counts = rng.integers(10, 26, size=len(_ONLINE_POOL_MCCS))
        total = int(store_counts.sum() + online_counts.sum())
        while True:
            ids = rng.integers(_INT64.min, _INT64.max, size=total, dtype=np.int64, endpoint=True)
            if len(np.unique(ids)) == total:
                break
        pos = 0
        self.store_pool: dict[tuple[int, int], np.ndarray] = {}
        for c in range(n_city):
            for j, mcc in enumerate(_STORE_POOL_MCCS):
                k = int(store_counts[c, j])
                self.store_pool[(c, mcc)] = ids[pos:pos + k]
                pos += k
        self.online_pool: dict[int, np.ndarray] = {}
        for j, mcc in enumerate(_ONLINE_POOL_MCCS):
            k = int(online_counts[j])
            self.online_pool[mcc] = ids[pos:pos + k]
            pos += k


# ---------------------------------------------------------------------------------------------
# Legitimate activity of one card
# ---------------------------------------------------------------------------------------------

_FIELDS = ("ts", "cents", "chip", "merchant", "city", "mcc", "err", "kind", "episode")


def _empty() -> dict[str, np.ndarray]:
    return {
        "ts": np.zeros(0, np.int64), "cents": np.zeros(0, np.int64),
        "chip": np.zeros(0, np.int8), "merchant": np.zeros(0, np.int64),
        "city": np.zeros(0, np.int32), "mcc": np.zeros(0, np.int32),
        "err": np.zeros(0, dtype=object), "kind": np.zeros(0, np.int8),
        "episode": np.zeros(0, np.int32),
    }


def _block(ts, cents, chip, merchant, city, mcc, err=None, kind=0, episode=0) -> dict:
    n = len(ts)
    return {
        "ts": np.asarray(ts, np.int64), "cents": np.asarray(cents, np.int64),
        "chip": np.broadcast_to(np.asarray(chip, np.int8), (n,)).copy(),
        "merchant": np.broadcast_to(np.asarray(merchant, np.int64), (n,)).copy(),
        "city": np.broadcast_to(np.asarray(city, np.int32), (n,)).copy(),
        "mcc": np.broadcast_to(np.asarray(mcc, np.int32), (n,)).copy(),
        "err": (np.full(n, "", dtype=object) if err is None else np.asarray(err, dtype=object)),
        "kind": np.full(n, kind, np.int8), "episode": np.full(n, episode, np.int32),
    }


def _concat(blocks: list[dict]) -> dict:
    blocks = [b for b in blocks if len(b["ts"])] or [_empty()]
    return {f: np.concatenate([b[f] for b in blocks]) for f in _FIELDS}


def _take(block: dict, mask) -> dict:
    return {f: block[f][mask] for f in _FIELDS}


def _amount_cents(rng, median, sigma, size, floor_cents=50) -> np.ndarray:
    x = np.asarray(median) * rng.lognormal(0.0, 1.0, size) ** np.asarray(sigma)
    return np.maximum(np.round(x * 100).astype(np.int64), floor_cents)


class _Card:
    """Legitimate transactions of one card plus what fraud injection needs to know about it."""

    def __init__(self, rng: np.random.Generator, world: _World, home_metro: int, home_city: int,
                 n_days: int, dow0: int, dom: np.ndarray):
        self.home_city = home_city
        self.home_state = world.city_state[home_city]
        metro_cities = world.metro_cities[home_metro]
        n_min = n_days * 1440

        # rhythms
        n_peaks = int(rng.integers(2, 5))
        peaks = np.sort(rng.choice(_PEAK_HOURS, n_peaks, replace=False)) + rng.normal(0, 0.4, n_peaks)
        peak_p = rng.dirichlet(np.full(n_peaks, 2.0))
        hour_sd = rng.uniform(0.3, 1.4)
        dow_w = rng.gamma(5.0, 1.0, 7)
        dow_w[5:] *= rng.uniform(0.6, 1.8)
        day_p = dow_w[(dow0 + np.arange(n_days)) % 7]
        day_p = day_p / day_p.sum()
        p_chip = rng.uniform(0.2, 0.9)
        rate = rng.gamma(3.0, _RATE_MEAN / 3.0)
        refund_p = rng.uniform(0.005, 0.025)
        insufficient = _INSUFFICIENT_RATES[rng.choice(3, p=[0.5, 0.35, 0.15])]
        self.p_chip = p_chip

        def draw_minutes(peak_idx):
            m = peaks[peak_idx] * 60 + rng.normal(0, hour_sd * 60, len(peak_idx))
            flat = rng.random(len(peak_idx)) < 0.08
            m = np.where(flat, rng.uniform(6 * 60, 23 * 60, len(peak_idx)), m)
            return np.floor(m).astype(np.int64) % 1440

        # regular merchants
        m_id, m_city, m_mcc, m_w, m_typ, m_sig, m_peak, m_ref = [], [], [], [], [], [], [], []
        for cats, online in ((_STORE_CATS, False), (_ONLINE_CATS, True)):
            for mcc, p_has, kmax, weight, median, sigma, refundable in cats:
                if rng.random() >= p_has:
                    continue
                k = int(rng.integers(1, kmax + 1))
                for _ in range(k):
                    if online:
                        city = -1
                        mid = rng.choice(world.online_pool[mcc])
                    else:
                        city = home_city if rng.random() < 0.75 else int(rng.choice(metro_cities))
                        mid = rng.choice(world.store_pool[(city, mcc)])
                    if mid in m_id:
                        continue
                    m_id.append(mid)
                    m_city.append(city)
                    m_mcc.append(mcc)
                    m_w.append(weight / k * rng.gamma(2.0, 0.5))
                    m_typ.append(median * rng.lognormal(0.0, 0.3))
                    m_sig.append(sigma)
                    m_peak.append(rng.choice(n_peaks, p=peak_p))
                    m_ref.append(refundable)
        m_id = np.array(m_id, np.int64)
        m_city = np.array(m_city, np.int32)
        m_mcc = np.array(m_mcc, np.int32)
        m_w = np.array(m_w)
        m_typ = np.array(m_typ)
        m_sig = np.array(m_sig)
        m_peak = np.array(m_peak, np.int64)
        m_ref = np.array(m_ref, bool)

        n = int(rng.poisson(rate * n_days))
        day = np.sort(rng.choice(n_days, n, p=day_p))
        mi = rng.choice(len(m_id), n, p=m_w / m_w.sum())
        ts = day * 1440 + draw_minutes(m_peak[mi])
        cents = _amount_cents(rng, m_typ[mi], m_sig[mi], n, floor_cents=50)
        online = m_city[mi] < 0
        chip = np.where(online, _ONLINE, np.where(rng.random(n) < p_chip, _CHIP, _SWIPE))
        disc = _block(ts, cents, chip, m_id[mi], m_city[mi], m_mcc[mi])
        disc_refundable = m_ref[mi]

        # trips (remove home in-person purchases during them)
        trip_blocks, trip_mask = [], np.zeros(n_days, bool)
        self.visited_states: set[str] = set()
        n_trips = int(rng.poisson(_TRIPS_PER_YEAR * n_days / 365.0))
        other_metros = np.nonzero(world.metro_state != self.home_state)[0]
        trip_p = world.metro_p[other_metros] / world.metro_p[other_metros].sum()
        for _ in range(n_trips):
            length = int(rng.integers(2, 7))
            if n_days <= length + 1:
                break
            d0 = int(rng.integers(0, n_days - length))
            dest = int(rng.choice(other_metros, p=trip_p))
            self.visited_states.add(world.metro_state[dest])
            trip_mask[d0:d0 + length] = True
            cities = world.metro_cities[dest]
            per_day = 1 + rng.poisson(1.2, length)
            tdays = np.repeat(np.arange(d0, d0 + length), per_day)
            k = len(tdays)
            ci = rng.choice(len(_TRIP_CATS), k, p=[c[1] for c in _TRIP_CATS])
            tcity = rng.choice(cities, k)
            tmcc = np.array([_TRIP_CATS[i][0] for i in ci], np.int32)
            tmed = np.array([_TRIP_CATS[i][2] for i in ci])
            tsig = np.array([_TRIP_CATS[i][3] for i in ci])
            tmer = np.array([rng.choice(world.store_pool[(int(c), int(m))])
                             for c, m in zip(tcity, tmcc)], np.int64)
            tts = tdays * 1440 + rng.integers(8 * 60, 22 * 60, k)
            tchip = np.where(rng.random(k) < p_chip, _CHIP, _SWIPE)
            trip_blocks.append(_block(tts, _amount_cents(rng, tmed, tsig, k, 100), tchip, tmer,
                                      tcity, tmcc))
            hotel_city = int(rng.choice(cities))
            trip_blocks.append(_block(
                [(d0 + length - 1) * 1440 + int(rng.integers(8 * 60, 11 * 60))],
                _amount_cents(rng, 140.0 * (length - 1), 0.3, 1, 100),
                _CHIP if rng.random() < p_chip else _SWIPE,
                rng.choice(world.store_pool[(hotel_city, _HOTEL_MCC)]), hotel_city, _HOTEL_MCC))
            buy_day = d0 - int(rng.integers(7, 46))
            if buy_day >= 0:
                amcc = int(rng.choice(_AIRLINE_MCCS))
                trip_blocks.append(_block(
                    [buy_day * 1440 + int(draw_minutes(np.array([rng.choice(n_peaks, p=peak_p)]))[0])],
                    _amount_cents(rng, 380.0, 0.4, 1, 100), _ONLINE,
                    rng.choice(world.online_pool[amcc]), -1, amcc))
        keep = ~(trip_mask[disc["ts"] // 1440] & (disc["city"] >= 0))
        disc = _take(disc, keep)
        disc_refundable = disc_refundable[keep]

        # monthly bills
        bill_blocks = []
        for mcc, p_has, median, sigma in _BILLS:
            if rng.random() >= p_has:
                continue
            bday = int(rng.integers(1, 29))
            bdays = np.nonzero(dom == bday)[0]
            k = len(bdays)
            mid = rng.choice(world.online_pool[mcc])
            typ = median * rng.lognormal(0.0, 0.35)
            peak = np.full(k, rng.choice(n_peaks, p=peak_p))
            bill_blocks.append(_block(bdays * 1440 + draw_minutes(peak),
                                      _amount_cents(rng, np.full(k, typ), sigma, k, 100),
                                      _ONLINE, mid, -1, mcc))

        # refunds of earlier purchases
        purchases = _concat([disc] + trip_blocks)
        refundable = np.concatenate([disc_refundable] + [np.ones(len(b["ts"]), bool) for b in trip_blocks])
        pick = (rng.random(len(refundable)) < refund_p) & refundable
        r = _take(purchases, pick)
        r_ts = r["ts"] + rng.integers(1440, 21 * 1440, len(r["ts"]))
        ok = r_ts < n_min
        refunds = _block(r_ts[ok], -r["cents"][ok], r["chip"][ok], r["merchant"][ok],
                         r["city"][ok], r["mcc"][ok])

        legit = _concat([purchases] + bill_blocks)
        # errors on purchases
        nl = len(legit["ts"])
        is_online = legit["chip"] == _ONLINE
        present = []
        for name, p, where in _ERR_FIXED:
            hit = rng.random(nl) < p
            if where == 0:
                hit &= ~is_online
            elif where == 1:
                hit &= is_online
            present.append((name, hit))
        present.append(("Insufficient Balance", rng.random(nl) < insufficient))
        present.sort(key=lambda t: t[0])
        err = np.full(nl, "", dtype=object)
        for name, hit in present:
            err = np.where(hit, np.where(err == "", name, err + "," + name), err)
        legit["err"] = err.astype(object)

        self.legit = _concat([legit, refunds])
        self.used_merchants = set(self.legit["merchant"].tolist())
        self.used_mccs = set(self.legit["mcc"].tolist())


# ---------------------------------------------------------------------------------------------
# Fraud episodes
# ---------------------------------------------------------------------------------------------


def _new_online_merchants(rng, world, mccs, used, k, distinct=False):
    """k (mcc, merchant) pairs from the online pools of ``mccs``, excluding merchants in ``used``."""
    cand_m, cand_c = [], []
    for mcc in mccs:
        pool = [m for m in world.online_pool[mcc].tolist() if m not in used]
        cand_m += pool
        cand_c += [mcc] * len(pool)
    idx = rng.choice(len(cand_m), k, replace=not distinct)
    return np.array(cand_c, np.int32)[idx], np.array(cand_m, np.int64)[idx]


def _episode(rng, world, card: _Card, kind: str, start_day: int, episode: int) -> dict:
    """Rows of one fraud episode (plus its optional fraud_refund row)."""
    legit = card.legit
    before = (legit["ts"] < start_day * 1440) & (legit["cents"] > 0)
    median = float(np.median(legit["cents"][before])) / 100.0
    code = _KIND_CODE[kind]
    if kind == "card_testing":
        if rng.random() < 0.5:
            t0 = start_day * 1440 + int(rng.integers(0, 6 * 60))
        else:
            t0 = start_day * 1440 + int(rng.integers(0, 1440))
        n_tiny = int(rng.integers(3, 9))
        tiny_ts = t0 + np.concatenate([[0], np.cumsum(rng.integers(1, 4, n_tiny - 1))])
        tiny_c = rng.integers(50, 301, n_tiny)
        tiny_mcc, tiny_m = _new_online_merchants(rng, world, _TEST_TINY_MCCS,
                                                 card.used_merchants, n_tiny, distinct=True)
        bad = rng.random(n_tiny) < 0.25
        which = rng.choice(np.array(["Bad CVV", "Bad Expiration", "Bad Card Number"], dtype=object),
                           n_tiny)
        tiny_err = np.where(bad, which, "").astype(object)
        n_large = int(rng.integers(1, 3))
        large_ts = tiny_ts[-1] + np.cumsum(rng.integers(5, 61, n_large))
        large_c = np.round(np.exp(rng.uniform(math.log(200), math.log(1500), n_large)) * 100)
        large_mcc, large_m = _new_online_merchants(rng, world, _TEST_LARGE_MCCS,
                                                   card.used_merchants | set(tiny_m.tolist()),
                                                   n_large, distinct=True)
        rows = _concat([
            _block(tiny_ts, tiny_c, _ONLINE, tiny_m, -1, tiny_mcc, tiny_err, code, episode),
            _block(large_ts, large_c, _ONLINE, large_m, -1, large_mcc, None, code, episode),
        ])
    elif kind == "account_takeover":
        n = int(rng.integers(4, 11))
        t0 = start_day * 1440 + int(rng.integers(8 * 60, 23 * 60))
        ts = t0 + np.concatenate([[0], np.cumsum(rng.integers(3, 26, n - 1))])
        cents = np.ceil(median * rng.uniform(3.0, 8.0, n) * 100).astype(np.int64)
        allowed = [m for m in _ATO_MCCS if m not in card.used_mccs]
        if not allowed:  # the card used all six (probability ~1e-7): its rarest one
            counts = {m: int((legit["mcc"] == m).sum()) for m in _ATO_MCCS}
            allowed = [min(_ATO_MCCS, key=lambda m: (counts[m], m))]
        mcc, mer = _new_online_merchants(rng, world, allowed, card.used_merchants, n)
        err = np.where(rng.random(n) < 0.1, "Insufficient Balance", "").astype(object)
        rows = _block(ts, cents, _ONLINE, mer, -1, mcc, err, code, episode)
    elif kind == "skimmed_card":
        banned = {card.home_state} | card.visited_states
        states = sorted({s for s in world.metro_state.tolist() if s not in banned})
        n_cities = min(int(rng.integers(2, 5)), len(states))
        chosen = rng.choice(np.array(states, dtype=object), n_cities, replace=False)
        t = start_day * 1440 + int(rng.integers(9 * 60, 20 * 60))
        blocks = []
        for i, st in enumerate(chosen):
            if i:
                t += int(rng.integers(3 * 60, 14 * 60 + 1))
            metros = np.nonzero(world.metro_state == st)[0]
            city = int(rng.choice(world.metro_cities[int(rng.choice(metros))]))
            k = int(rng.integers(2, 5))
            ts = t + np.concatenate([[0], np.cumsum(rng.integers(5, 61, k - 1))])
            mcc = rng.choice(np.array(_SKIM_MCCS), k)
            mer = np.array([rng.choice(world.store_pool[(city, int(m))]) for m in mcc], np.int64)
            cents = np.minimum(_amount_cents(rng, max(1.5 * median, 40.0), 0.5, k, 100), 150000)
            err = np.where(rng.random(k) < 0.1, "Bad PIN", "").astype(object)
            blocks.append(_block(ts, cents, _SWIPE, mer, city, mcc, err, code, episode))
        rows = _concat(blocks)
    else:  # pragma: no cover - guarded by the caller
        raise ValueError(kind)

    if rng.random() < FRAUD_REFUND_PROB:
        big = np.nonzero(rows["cents"] >= 500)[0]
        i = int(rng.choice(big if len(big) else np.arange(len(rows["ts"]))))
        r_ts = rows["ts"][i] + int(rng.integers(180, 4 * 1440 + 1))
        rows = _concat([rows, _block([r_ts], [-rows["cents"][i]], rows["chip"][i],
                                     rows["merchant"][i], rows["city"][i], rows["mcc"][i],
                                     None, _KIND_CODE["fraud_refund"], episode)])
    return rows


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def simulate(customers: int = 200, seed: int = 7, start="2023-01-01", days: int = 365) -> pd.DataFrame:
    """Simulate ``customers`` customers' card transactions over ``days`` days from ``start``.

    Returns a frame with :data:`COLUMNS` (TabFormer's 15 columns plus ``Fraud Episode`` and
    ``Fraud Kind``), one row per transaction, ordered by User, Card, time. Text columns hold the
    exact TabFormer text (``"$-25.00"``, ``"06:21"``, ``"91750.0"``); User, Card, Year, Month,
    Day, Merchant Name and MCC are int64. The fraud rules are in the module docstring. The result
    depends only on the arguments: the same arguments give an identical frame (and CSV).

    ``start`` is a date (``"2023-01-01"`` or anything :class:`pandas.Timestamp` accepts; the
    time of day is ignored); ``days`` must be at least 28.
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

    world_ss, cust_ss, fraud_ss = np.random.SeedSequence(int(seed)).spawn(3)
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
    episode = [f"E{e:04d}" if e else "" for e in r["episode"].tolist()]
    cols = {
        "User": user, "Card": card, "Year": year, "Month": month, "Day": day,
        "Time": time_s, "Amount": amount_s, "Use Chip": CHIP_NAMES[r["chip"]],
        "Merchant Name": r["merchant"], "Merchant City": world.city_name[city],
        "Merchant State": world.city_state[city], "Zip": world.city_zip[city],
        "MCC": r["mcc"].astype(np.int64), "Errors?": r["err"],
        "Is Fraud?": np.where(fraud, "Yes", "No").astype(object),
        "Fraud Episode": episode, "Fraud Kind": _KIND_NAMES[r["kind"]],
    }
    # text columns become pandas' default string dtype (``str`` in pandas 3, object before)
    df = pd.DataFrame({k: (np.asarray(v, dtype=object) if k in _TEXT_COLS else np.asarray(v, np.int64))
                       for k, v in cols.items()})
    return df[COLUMNS]


_TEXT_COLS = {"Time", "Amount", "Use Chip", "Merchant City", "Merchant State", "Zip", "Errors?",
              "Is Fraud?", "Fraud Episode", "Fraud Kind"}


def csv_bytes(df: pd.DataFrame) -> bytes:
    """The exact bytes :func:`write_csv` writes for ``df`` (UTF-8, ``\\n`` line ends, no index)."""
    return df.to_csv(index=False, lineterminator="\n").encode("utf-8")


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


def main(customers: int = 200, seed: int = 7, out="demo_data/transactions.csv") -> str:
    """Simulate, write the CSV to ``out`` and return a one-line summary (what the CLI prints)."""
    df = simulate(customers=customers, seed=seed)
    path = write_csv(df, out)
    s = summarize(df)
    kinds = ", ".join(f"{k} {n}" for k, n in s["fraud_rows_by_kind"].items())
    return (f"wrote {path}: {s['rows']:,} rows, {s['customers']} customers, {s['cards']} cards, "
            f"{s['fraud_rows']} fraud rows ({100 * s['fraud_rows'] / max(s['rows'], 1):.2f}%) in "
            f"{s['episodes']} episodes on {s['cards_with_episode']} cards ({kinds}); "
            f"{path.stat().st_size:,} bytes")
