"""The simulator's world: real metros and zip codes, merchant categories (MCC) and merchant pools, rates."""

from __future__ import annotations

import numpy as np

TABFORMER_COLUMNS = [
    "User", "Card", "Year", "Month", "Day", "Time", "Amount", "Use Chip", "Merchant Name",
    "Merchant City", "Merchant State", "Zip", "MCC", "Errors?", "Is Fraud?",
]
EXTRA_COLUMNS = ["Fraud Episode", "Fraud Kind", "Fraud Cause"]
COLUMNS = TABFORMER_COLUMNS + EXTRA_COLUMNS

EPISODE_KINDS = ("card_testing", "account_takeover", "skimmed_card", "tested_then_cnp", "compromised_merchant")
FRAUD_KINDS = EPISODE_KINDS + ("fraud_refund",)

EPISODE_CARD_SHARE = 0.08
FRAUD_REFUND_PROB = 1.0 / 3.0
MIN_HISTORY = 8
MIN_DAYS = 28
#: planted causes: the cause lies this many legitimate transactions before the fraud (inclusive range)
CAUSE_GAP_ROWS = (3, 8)
#: compromised merchants: the fraud starts this many days after the card's visit (inclusive range)
COMPROMISE_DELAY_DAYS = (7, 30)

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
