{#-
  Exact SCD type 2 from a change log: one version per change that leaves a row (every change, not
  sampled like dbt snapshots). valid_from is the commit timestamp of the change that produced the
  version; valid_to the commit timestamp of the next change to the same key (an update, a delete,
  or an update that moves the row to another key), NULL while the version is current. Ties of
  timestamps are broken by commit order (valid_*_lsn, valid_*_seq).
-#}
{% macro loader_scd2(change_log, key, columns) %}
{%- set part = loader_key_list(key) -%}
with truncates as (
  {{ loader_truncates(change_log) }}
),
ev as (
  select
    {%- for c in columns %}
    {{ loader_q(c ~ '__after') }} as {{ loader_q(c) }},
    {%- endfor %}
    pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation, 1 as __l_start
  from {{ change_log }}
  where exists_after
  union all
  select
    {%- for c in columns %}
    {% if c in key %}{{ loader_q(c ~ '__before') }}{% else %}null{% endif %} as {{ loader_q(c) }},
    {%- endfor %}
    pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation, 0 as __l_start
  from {{ change_log }}
  where pg_operation = 'delete' or key_changed
),
versions as (
  select
    *,
    {#- no named WINDOW clause: Spark loses it when an Iceberg view over this view is expanded #}
    lead(pg_txn_timestamp) over (partition by {{ part }} order by pg_lsn, pg_seq, __l_start) as valid_to,
    lead(pg_lsn) over (partition by {{ part }} order by pg_lsn, pg_seq, __l_start) as valid_to_lsn,
    lead(pg_seq) over (partition by {{ part }} order by pg_lsn, pg_seq, __l_start) as valid_to_seq,
    lead(pg_operation) over (partition by {{ part }} order by pg_lsn, pg_seq, __l_start) as ended_by,
    -- the first TRUNCATE or resync after the version started ends it too
    array_min(filter(truncates.arr, t -> t.lsn > pg_lsn or (t.lsn = pg_lsn and t.seq > pg_seq))) as next_truncate
  from ev cross join truncates
),
ended as (
  select
    *,
    next_truncate is not null and (
      valid_to_lsn is null or next_truncate.lsn < valid_to_lsn
      or (next_truncate.lsn = valid_to_lsn and next_truncate.seq < valid_to_seq)
    ) as __l_truncated
  from versions
)
select
  {%- for c in columns %}
  {{ loader_q(c) }},
  {%- endfor %}
  pg_txn_timestamp as valid_from,
  if(__l_truncated, next_truncate.ts, valid_to) as valid_to,
  pg_lsn as valid_from_lsn,
  pg_seq as valid_from_seq,
  if(__l_truncated, next_truncate.lsn, valid_to_lsn) as valid_to_lsn,
  if(__l_truncated, next_truncate.seq, valid_to_seq) as valid_to_seq,
  valid_to_lsn is null and next_truncate is null as is_current,
  pg_operation as started_by,
  if(__l_truncated, next_truncate.op, ended_by) as ended_by,
  pg_txn_id
from ended
where __l_start = 1
{% endmacro %}

{#-
  Newest row per key recomputed from history (what the Simple views computed by scanning history):
  the current versions of the SCD2 model. The reconciliation audit compares it with the current table.
-#}
{% macro loader_current_from_history(scd2, columns) %}
select
  {%- for c in columns %}
  {{ loader_q(c) }},
  {%- endfor %}
  valid_from_lsn as pg_lsn,
  valid_from_seq as pg_seq,
  valid_from as pg_txn_timestamp
from {{ scd2 }}
where is_current
{% endmacro %}
