"""Read raw transaction files through a dataset spec, validate them, and account for every row.

CONTRACT (other modules rely on it):

``read_transactions(path, spec) -> LoadResult``

``LoadResult.frame`` is the canonical transaction frame, one row per accepted input row,
sorted by (entity_id, timestamp, row_number), index reset, with columns:

=================  ===============  ==========================================================
column             dtype            meaning
=================  ===============  ==========================================================
row_number         int64            1-based record number in the file (CSV: line = row_number + 1)
transaction_id     string (object)  spec.id column as text, else ``"r{row_number}"``
entity_id          string (object)  entity columns joined with spec.entity.separator ("0:3")
timestamp          datetime64[ns]   naive UTC
amount             float64          signed amount in spec.amount.currency; negative = refund
<field.name>       object (str)     categorical fields, normalised text ("91750", "<empty>")
<field.name>       float64          numeric fields
<field.name>       object (str)     multi-valued fields: sorted values joined with "|", "" = none
label              Int8 (nullable)  1 fraud, 0 legit, <NA> unknown (column absent if no label)
<passthrough>      as read          spec.passthrough columns, original names, never model input
=================  ===============  ==========================================================

``LoadResult.rejected`` has columns file, row_number, column, value, reason (one row per
rejected input row). ``rows_read == len(frame) + len(rejected)`` always holds.
"""
