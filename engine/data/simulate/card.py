"""One simulated card: legitimate activity and fraud episodes (card testing, takeover, skimming, refunds)."""

from __future__ import annotations

import math

import numpy as np

from engine.data.simulate.world import (
    _AIRLINE_MCCS,
    _ATO_MCCS,
    _BILLS,
    _CHIP,
    _ERR_FIXED,
    _HOTEL_MCC,
    _INSUFFICIENT_RATES,
    _KIND_CODE,
    _ONLINE,
    _ONLINE_CATS,
    _PEAK_HOURS,
    _RATE_MEAN,
    _SKIM_MCCS,
    CAUSE_GAP_ROWS,
    COMPROMISE_DELAY_DAYS,
    _STORE_CATS,
    _SWIPE,
    _TEST_LARGE_MCCS,
    _TEST_TINY_MCCS,
    _TRIP_CATS,
    _TRIPS_PER_YEAR,
    FRAUD_REFUND_PROB,
    _World,
)

# ---------------------------------------------------------------------------------------------
# Legitimate activity of one card
# ---------------------------------------------------------------------------------------------

_FIELDS = ("ts", "cents", "chip", "merchant", "city", "mcc", "err", "kind", "episode", "cause")


def _empty() -> dict[str, np.ndarray]:
    return {
        "ts": np.zeros(0, np.int64), "cents": np.zeros(0, np.int64),
        "chip": np.zeros(0, np.int8), "merchant": np.zeros(0, np.int64),
        "city": np.zeros(0, np.int32), "mcc": np.zeros(0, np.int32),
        "err": np.zeros(0, dtype=object), "kind": np.zeros(0, np.int8),
        "episode": np.zeros(0, np.int32), "cause": np.zeros(0, np.int32),
    }


def _block(ts, cents, chip, merchant, city, mcc, err=None, kind=0, episode=0, cause=0) -> dict:
    n = len(ts)
    return {
        "ts": np.asarray(ts, np.int64), "cents": np.asarray(cents, np.int64),
        "chip": np.broadcast_to(np.asarray(chip, np.int8), (n,)).copy(),
        "merchant": np.broadcast_to(np.asarray(merchant, np.int64), (n,)).copy(),
        "city": np.broadcast_to(np.asarray(city, np.int32), (n,)).copy(),
        "mcc": np.broadcast_to(np.asarray(mcc, np.int32), (n,)).copy(),
        "err": (np.full(n, "", dtype=object) if err is None else np.asarray(err, dtype=object)),
        "kind": np.full(n, kind, np.int8), "episode": np.full(n, episode, np.int32),
        "cause": np.full(n, cause, np.int32),
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
    elif kind == "tested_then_cnp":
        rows = _tested_then_cnp(rng, world, card, start_day, code, episode)
    elif kind == "compromised_merchant":
        rows, visit = _compromised_merchant(rng, world, card, start_day, median, code, episode)
    else:  # pragma: no cover - guarded by the caller
        raise ValueError(kind)

    if rng.random() < FRAUD_REFUND_PROB:
        big = np.nonzero(rows["cents"] >= 500)[0]
        i = int(rng.choice(big if len(big) else np.arange(len(rows["ts"]))))
        r_ts = rows["ts"][i] + int(rng.integers(180, 4 * 1440 + 1))
        rows = _concat([rows, _block([r_ts], [-rows["cents"][i]], rows["chip"][i],
                                     rows["merchant"][i], rows["city"][i], rows["mcc"][i],
                                     None, _KIND_CODE["fraud_refund"], episode)])
    if kind == "compromised_merchant":
        rows = _concat([visit, rows])
    return rows


def _tested_then_cnp(rng, world, card: _Card, start_day: int, code: int, episode: int) -> dict:
    """A planted cause that is not the latest row: 1-2 tiny test charges at new online merchants,
    ``CAUSE_GAP_ROWS`` legitimate transactions before 1-3 large card-not-present purchases."""
    t_fraud = start_day * 1440 + int(rng.integers(8 * 60, 23 * 60))
    lt = np.sort(card.legit["ts"][card.legit["ts"] < t_fraud])
    gap = min(int(rng.integers(CAUSE_GAP_ROWS[0], CAUSE_GAP_ROWS[1] + 1)), len(lt) - 1)
    lo, hi = int(lt[-gap - 1]), int(lt[-gap])  # the tests fall between these two legitimate rows
    n_test = int(rng.integers(1, 3))
    t_test = lo + 1 + int(rng.integers(0, max(1, hi - lo - 2 * n_test)))
    test_ts = t_test + np.arange(n_test) * int(rng.integers(1, 3))
    test_mcc, test_m = _new_online_merchants(rng, world, _TEST_TINY_MCCS, card.used_merchants, n_test,
                                             distinct=True)
    n_large = int(rng.integers(1, 4))
    large_ts = t_fraud + np.concatenate([[0], np.cumsum(rng.integers(5, 91, n_large - 1))])
    large_c = np.round(np.exp(rng.uniform(math.log(200), math.log(1500), n_large)) * 100)
    large_mcc, large_m = _new_online_merchants(rng, world, _TEST_LARGE_MCCS,
                                               card.used_merchants | set(test_m.tolist()), n_large,
                                               distinct=True)
    return _concat([
        _block(test_ts, rng.integers(50, 301, n_test), _ONLINE, test_m, -1, test_mcc, None, code, episode,
               cause=episode),
        _block(large_ts, large_c, _ONLINE, large_m, -1, large_mcc, None, code, episode),
    ])


def _compromised_merchant(rng, world, card: _Card, start_day: int, median: float, code: int,
                          episode: int) -> tuple[dict, dict]:
    """A planted cause weeks before the fraud: an ordinary-looking in-person purchase (labelled
    legitimate) at one of the card's own stores, whose card reader is compromised; ``COMPROMISE_DELAY_DAYS``
    later counterfeit swipe purchases in another state. Returns ``(fraud rows, the visit row)``."""
    delay = int(rng.integers(COMPROMISE_DELAY_DAYS[0], COMPROMISE_DELAY_DAYS[1] + 1))
    legit = card.legit
    stores = np.unique(legit["merchant"][(legit["city"] >= 0) & (legit["cents"] > 0)])
    t_visit = max(0, start_day - delay) * 1440 + int(rng.integers(9 * 60, 20 * 60))
    if len(stores):
        mer = int(rng.choice(stores))
        i = int(np.flatnonzero(legit["merchant"] == mer)[0])
        city, mcc = int(legit["city"][i]), int(legit["mcc"][i])
    else:  # a card that only shops online: a gas station in its home city
        city, mcc = card.home_city, 5541
        mer = int(rng.choice(world.store_pool[(city, mcc)]))
    visit = _block([t_visit], _amount_cents(rng, 40.0, 0.5, 1, 100), _SWIPE, mer, city, mcc, cause=episode)
    banned = {card.home_state} | card.visited_states
    states = sorted({s for s in world.metro_state.tolist() if s not in banned})
    st = rng.choice(np.array(states, dtype=object))
    metros = np.nonzero(world.metro_state == st)[0]
    fcity = int(rng.choice(world.metro_cities[int(rng.choice(metros))]))
    k = int(rng.integers(3, 7))
    t0 = start_day * 1440 + int(rng.integers(9 * 60, 20 * 60))
    ts = t0 + np.concatenate([[0], np.cumsum(rng.integers(5, 61, k - 1))])
    fmcc = rng.choice(np.array(_SKIM_MCCS), k)
    fmer = np.array([rng.choice(world.store_pool[(fcity, int(m))]) for m in fmcc], np.int64)
    cents = np.minimum(_amount_cents(rng, max(1.5 * median, 40.0), 0.5, k, 100), 150000)
    return _block(ts, cents, _SWIPE, fmer, fcity, fmcc, None, code, episode), visit
