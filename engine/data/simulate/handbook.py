"""A Handbook-like transaction generator that writes files of any size in bounded memory.

A simplified version of the simulator of the Fraud Detection Handbook (Le Borgne, Siblini,
Lebichot, Bontempi, "Reproducible Machine Learning for Credit Card Fraud Detection - Practical
Handbook", Université Libre de Bruxelles, chapter 3.2,
https://fraud-detection-handbook.github.io/fraud-detection-handbook/Chapter_3_GettingStarted/SimulatedDataset.html).
It writes the Handbook file's columns and types, so ``--spec handbook`` reads it::

    TRANSACTION_ID int64, TX_DATETIME timestamp[ns], CUSTOMER_ID int64, TERMINAL_ID int64,
    TX_AMOUNT float64, TX_TIME_SECONDS int64, TX_TIME_DAYS int64, TX_FRAUD int64,
    TX_FRAUD_SCENARIO int64

Customers are generated in chunks (``CHUNK_CUSTOMERS`` at a time, vectorised numpy), each chunk
is written as one Parquet row group and dropped, so memory does not grow with the row count.
Rows are ordered by customer, then time (not by time over the whole file, as the Handbook's).

Per customer (as in the Handbook): a mean amount ~ U(5, 100) (standard deviation half of it,
a negative draw replaced by U(0, 2 mean)), a mean number of transactions per day ~ U(0, 4)
(the day's count is Poisson), times of day ~ N(12 h, 20,000 s) (a draw outside the day replaced
by a uniform time). Simplification: instead of terminals within a radius of the customer's
location, a customer uses 80 neighbouring terminal ids around a random one (2 terminals per
customer, as the Handbook's 10,000 for 4,990 customers).

Fraud, with ``TX_FRAUD_SCENARIO`` saying why (the Handbook's three scenarios):

1. an amount above 220 is a fraud;
2. compromised terminals: 2 per day per 10,000 terminals (each at most once; with fewer than
   2,500 terminals, 2 x days / 10,000 per terminal in all, spread over the days); every
   transaction there in the next 28 days is a fraud;
3. compromised customers: each customer with probability 3 x days / 4,990 (the Handbook's 3
   per day among 4,990), from a random day: over 14 days, each transaction is a fraud with
   probability 1/3 and its amount is multiplied by 5.

A later scenario overrides an earlier one's label (as in the Handbook). The same ``(rows,
seed, days)`` always give the same rows (every draw comes from ``numpy.random.default_rng``
seeded from ``(seed, stream, chunk)``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CHUNK_CUSTOMERS = 2000
START = np.datetime64("2018-04-01T00:00:00", "ns")
DAY_S = 86400
#: mean transactions per customer and day: U(0, 4) has mean 2
_MEAN_TX_PER_DAY = 2.0
_TERMINALS_PER_CUSTOMER = 80

SCHEMA = pa.schema([
    ("TRANSACTION_ID", pa.int64()), ("TX_DATETIME", pa.timestamp("ns")), ("CUSTOMER_ID", pa.int64()),
    ("TERMINAL_ID", pa.int64()), ("TX_AMOUNT", pa.float64()), ("TX_TIME_SECONDS", pa.int64()),
    ("TX_TIME_DAYS", pa.int64()), ("TX_FRAUD", pa.int64()), ("TX_FRAUD_SCENARIO", pa.int64()),
])


def _terminal_compromise(n_terminals: int, days: int, seed: int) -> np.ndarray:
    """``[n_terminals]`` int64: the day each terminal is compromised from, or a day past the end."""
    rng = np.random.default_rng([seed, 1])
    per_day = round(2 * n_terminals / 10_000)
    if per_day >= 1:
        n = min(n_terminals, per_day * days)
        days_from = np.repeat(np.arange(days), per_day)[:n]
    else:  # fewer than 2,500 terminals: fewer than one a day, spread evenly over the days
        n = min(n_terminals, max(1, round(2 * days * n_terminals / 10_000)))
        days_from = (np.arange(n) * days) // n
    start = np.full(n_terminals, days + 10_000, dtype=np.int64)
    start[rng.choice(n_terminals, size=n, replace=False)] = days_from
    return start


def _chunk(first_customer: int, n_customers: int, n_terminals: int, comp_start: np.ndarray, days: int,
           seed: int, chunk: int) -> dict[str, np.ndarray]:
    """Transactions of customers ``first_customer ..`` (columns of :data:`SCHEMA` but the id)."""
    rng = np.random.default_rng([seed, 2, chunk])
    c = n_customers
    mean_amt = rng.uniform(5, 100, c)
    rate = rng.uniform(0, 2 * _MEAN_TX_PER_DAY, c)
    base = rng.integers(0, n_terminals, c)
    compromised = rng.random(c) < min(1.0, 3 * days / 4990)
    comp_day = rng.integers(0, days, c)
    counts = rng.poisson(np.repeat(rate, days).reshape(c, days))  # [customer, day]
    per = counts.ravel()
    cust = np.repeat(np.repeat(np.arange(c), days), per)
    day = np.repeat(np.tile(np.arange(days), c), per)
    n = len(cust)
    tod = rng.normal(DAY_S / 2, 20_000, n)
    out_of_day = (tod < 0) | (tod >= DAY_S)
    tod[out_of_day] = rng.uniform(0, DAY_S, int(out_of_day.sum()))
    tod = tod.astype(np.int64)
    amt = rng.normal(mean_amt[cust], mean_amt[cust] / 2)
    neg = amt < 0
    amt[neg] = rng.uniform(0, 2 * mean_amt[cust][neg])
    term = (base[cust] + rng.integers(0, _TERMINALS_PER_CUSTOMER, n)) % n_terminals
    order = np.lexsort((tod, day, cust))
    cust, day, tod, amt, term = cust[order], day[order], tod[order], amt[order], term[order]
    scenario = np.zeros(n, dtype=np.int64)
    scenario[amt > 220] = 1
    scenario[(day >= comp_start[term]) & (day < comp_start[term] + 28)] = 2
    in_window = compromised[cust] & (day >= comp_day[cust]) & (day < comp_day[cust] + 14)
    hit = in_window & (rng.random(n) < 1 / 3)
    amt[hit] *= 5
    scenario[hit] = 3
    secs = day * DAY_S + tod
    return {
        "TX_DATETIME": START + secs.astype("timedelta64[s]").astype("timedelta64[ns]"),
        "CUSTOMER_ID": cust.astype(np.int64) + first_customer, "TERMINAL_ID": term.astype(np.int64),
        "TX_AMOUNT": np.round(amt, 2), "TX_TIME_SECONDS": secs, "TX_TIME_DAYS": day.astype(np.int64),
        "TX_FRAUD": (scenario > 0).astype(np.int64), "TX_FRAUD_SCENARIO": scenario,
    }


def generate_handbook_like(rows: int, out: str | Path, *, seed: int = 0, days: int = 183,
                           chunk_customers: int = CHUNK_CUSTOMERS) -> dict[str, int]:
    """Write exactly ``rows`` Handbook-like transactions to the Parquet file ``out``.

    Args:
        rows: number of transactions (>= 1).
        out: the Parquet file to write (parent folders are created).
        seed: random seed (same arguments -> same rows).
        days: simulated days from 2018-04-01.
        chunk_customers: customers generated (and held in memory) at once.
    Returns:
        ``{"rows", "customers", "terminals", "frauds", "row_groups"}``.
    Raises:
        ValueError: ``rows`` or ``days`` below 1.
    """
    if rows < 1 or days < 1:
        raise ValueError(f"rows and days must be >= 1 (got rows={rows}, days={days})")
    est_customers = math.ceil(rows / (_MEAN_TX_PER_DAY * days)) + 1
    n_terminals = max(_TERMINALS_PER_CUSTOMER, 2 * est_customers)
    comp_start = _terminal_compromise(n_terminals, days, seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = customers = frauds = groups = 0
    with pq.ParquetWriter(out, SCHEMA, compression="zstd") as w:
        while written < rows:
            cols = _chunk(customers, chunk_customers, n_terminals, comp_start, days, seed, groups)
            take = min(rows - written, len(cols["CUSTOMER_ID"]))
            cols = {k: v[:take] for k, v in cols.items()}
            cols["TRANSACTION_ID"] = np.arange(written, written + take, dtype=np.int64)
            w.write_table(pa.table({f.name: cols[f.name] for f in SCHEMA}, schema=SCHEMA))
            written += take
            frauds += int(cols["TX_FRAUD"].sum())
            customers = int(cols["CUSTOMER_ID"][-1]) + 1 if take else customers
            groups += 1
    return {"rows": written, "customers": customers, "terminals": n_terminals, "frauds": frauds,
            "row_groups": groups}
