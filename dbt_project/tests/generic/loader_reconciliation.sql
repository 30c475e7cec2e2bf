{#-
  Reconciliation: the current table equals the newest row per key recomputed from history, as of
  the position the current table was merged through, so changes loaded but not merged yet are not
  counted as differences. That position is the newer of the table property
  loader.merged-through (which snapshot expiry and compaction never remove) and the same key in
  the snapshot summaries still present. Every column and the position of the change that produced
  each row are compared; failing rows say on which side a row is missing.
-#}
{% test loader_reconciliation(model, scd2, columns) %}
{%- set prop = namespace(token='') -%}
{%- if execute -%}
  {%- for row in run_query("SHOW TBLPROPERTIES " ~ model) if row[0] == 'loader.merged-through' -%}
    {%- set prop.token = row[1] -%}
  {%- endfor -%}
{%- endif %}
with tok as (
  select greatest(coalesce(max_by(s.summary['loader.merged-through'], s.committed_at), ''), {{ loader_str(prop.token) }}) as t
  from {{ model }}.snapshots s
  join {{ model }}.history h on s.snapshot_id = h.snapshot_id
  where h.is_current_ancestor and s.summary['loader.merged-through'] is not null
),
cut as (
  select cast(conv(substr(t, 1, 16), 16, 10) as bigint) as lsn, cast(substr(t, 18) as bigint) as seq from tok where t <> ''
  union all
  select null, null from tok where t = ''
),
recomputed as (
  select
    {%- for c in columns %}
    v.{{ loader_q(c) }},
    {%- endfor %}
    v.valid_from_lsn as pg_lsn, v.valid_from_seq as pg_seq, v.valid_from as pg_txn_timestamp
  from {{ scd2 }} v cross join cut
  where (cut.lsn is null or v.valid_from_lsn < cut.lsn or (v.valid_from_lsn = cut.lsn and v.valid_from_seq <= cut.seq))
    and (v.valid_to_lsn is null
         or (cut.lsn is not null and (v.valid_to_lsn > cut.lsn or (v.valid_to_lsn = cut.lsn and v.valid_to_seq > cut.seq))))
),
cur as (
  select
    {%- for c in columns %}
    {{ loader_q(c) }},
    {%- endfor %}
    pg_lsn, pg_seq, pg_txn_timestamp
  from {{ model }}
),
only_current as (select * from cur except all select * from recomputed),
only_history as (select * from recomputed except all select * from cur)
select 'in current, not in the recompute from history' as problem, * from only_current
union all
select 'in the recompute from history, not in current' as problem, * from only_history
{% endtest %}
