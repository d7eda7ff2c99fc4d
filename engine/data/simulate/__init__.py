"""Seeded simulator of credit-card transactions in the IBM TabFormer format, with labelled fraud.

``simulate(customers, seed, start, days)`` returns a :class:`pandas.DataFrame` whose columns and
text formats are exactly those of TabFormer's ``card_transaction.v1.csv`` (see
``shared/data/tabformer/SOURCE.md``) plus three evaluation-only columns::

    User,Card,Year,Month,Day,Time,Amount,Use Chip,Merchant Name,Merchant City,Merchant State,
    Zip,MCC,Errors?,Is Fraud?,Fraud Episode,Fraud Kind,Fraud Cause

``Fraud Episode`` (``"E0007"``) and ``Fraud Kind`` are empty on legitimate rows. ``Fraud Cause``
holds the episode id on the rows planted as that episode's *cause* (kinds 5 and 6 below; a cause
row can be labelled legitimate) and is empty elsewhere. They are ground truth for evaluation and
explanation checks and must never be model input. ``write_csv`` writes
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
``round(0.08 * number_of_cards)`` cards (at least 1) get exactly one episode each; the cards are
drawn uniformly among *eligible* ones (at least 8 legitimate purchases before the earliest
possible start, which is day ``max(0.1 * days, day after the 8th purchase)``; latest start day
``days - 6``). The kinds are assigned as evenly as possible (a shuffled round-robin of the
five primary kinds); episodes are numbered ``E0001``, ``E0002``, ... in (User, Card) order. The
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
4. ``tested_then_cnp`` (a planted cause that is not the latest row): 1-2 tiny online test charges
   of U{$0.50..$3.00} at new small-ticket merchants (labelled fraud, ``Fraud Cause`` = the episode),
   placed between two legitimate transactions so that 3-8 (``CAUSE_GAP_ROWS``) legitimate rows lie
   between them and the fraud; then, at a uniform minute in 08:00-23:00 of the start day, 1-3 large
   card-not-present purchases 5-90 minutes apart of exp(U(ln 200, ln 1500)) dollars at new
   merchants in 5732/5311/5944/5045.
5. ``compromised_merchant`` (a planted cause weeks before the fraud): 7-30 days
   (``COMPROMISE_DELAY_DAYS``) before the start day, one ordinary swipe purchase of about $40 at one
   of the card's own stores (labelled legitimate, ``Fraud Cause`` = the episode: its card reader
   was compromised); on the start day 3-6 counterfeit swipe purchases 5-60 minutes apart in one
   city of a state that is neither the home state nor a trip state, amounts as in skimming.
   (An address or device change before account takeover cannot be planted: the TabFormer format
   has no such column.)
6. ``fraud_refund``: with probability 1/3 an episode of kind 1-5 also gets one refund of one of
   its charges (uniform among those >= $5, else among all): same merchant, city and channel,
   amount exactly minus the charge, 3 hours to 4 days after it. Labelled fraud, same episode id,
   kind ``fraud_refund``.

Every fraud row has ``Is Fraud?`` = Yes, its episode id and its kind; legit rows have ``No`` and
empty episode/kind. Legitimate activity of the card goes on unchanged around an episode, which
is what makes episodes visible in the sequence (sudden new channel, place, MCC, amount scale).

Package map: :mod:`~engine.data.simulate.world` (metros, MCCs, merchant pools),
:mod:`~engine.data.simulate.card` (one card's legitimate activity and fraud episodes),
:mod:`~engine.data.simulate.generate` (:func:`simulate`, :func:`write_csv`, :func:`summarize`, ``main``).
"""

from engine.data.simulate.generate import (
    csv_bytes,
    main,
    simulate,
    summarize,
    write_csv,
)
from engine.data.simulate.world import (
    COLUMNS,
    EPISODE_KINDS,
    EXTRA_COLUMNS,
    FRAUD_KINDS,
    TABFORMER_COLUMNS,
)

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
