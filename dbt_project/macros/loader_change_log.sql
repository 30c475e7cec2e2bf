{#-
  Change log of one history table: one row per change with the row's values before and after it
  and the list of columns that changed.

  history  - the history relation (source('history', ...))
  key      - primary key columns
  columns  - every source column, in order
  old_key  - {key column: SQL expression typing it out of pg_old_key (JSON of the old identity)}

  How "before" is found: every history row becomes key events (as in loader/merge/sql.py): an
  "end" of the old key (deletes, and updates that change the key) and a "put" of the new key
  (inserts, updates, snapshot reads). Within a key, the state after a put carries columns the
  change did not send (unchanged TOAST values, listed in pg_absent_columns) from the previous put;
  a put that moves a row to a new key takes them from the old key's state. The state before a
  change is the state after the key's previous put (none after an end). A TRUNCATE or a resync
  (the loader's re-snapshot of the table: its rows follow as reads) starts a new epoch: windows
  are partitioned by key and epoch, so nothing is carried across it. Park rows carry no row.
-#}
{% macro loader_change_log(history, key, columns, old_key) %}
{%- set nonkey = [] -%}
{%- for c in columns if c not in key %}{% do nonkey.append(c) %}{% endfor -%}
{%- set pos = 'pg_lsn, pg_seq, __l_sub' -%}
{%- set part = loader_key_list(key) ~ ', __l_epoch' -%}
{%- set upto = 'rows between unbounded preceding and current row' -%}
with truncates as (
  {{ loader_truncates(history) }}
),
h as (
  select
    hist.*,
    {{ loader_epoch('truncates.arr', 'hist.pg_lsn', 'hist.pg_seq') }} as __l_epoch,
    {%- for k in key %}
    {{ old_key[k] }} as __l_ok_{{ loop.index }},
    {%- endfor %}
    pg_operation = 'update' and pg_old_key is not null and not (
      {%- for k in key %}{{ old_key[k] }} <=> {{ loader_q(k) }}{% if not loop.last %} and {% endif %}{% endfor -%}
    ) as __l_key_changed
  from {{ history }} hist cross join truncates
),
ev as (
  select
    {%- for k in key %}
    __l_ok_{{ loop.index }} as {{ loader_q(k) }},
    {%- endfor %}
    {%- for c in nonkey %}
    null as {{ loader_q(c) }},
    {%- endfor %}
    pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation, __l_epoch,
    'end' as __l_kind, 0 as __l_sub, cast(array() as array<string>) as __l_absent
  from h
  where pg_operation = 'delete' or __l_key_changed
  union all
  select
    {%- for k in key %}
    {{ loader_q(k) }},
    {%- endfor %}
    {%- for c in nonkey %}
    {{ loader_q(c) }},
    {%- endfor %}
    pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation, __l_epoch,
    'put' as __l_kind, 1 as __l_sub, coalesce(pg_absent_columns, cast(array() as array<string>)) as __l_absent
  from h
  where pg_operation in ('insert', 'update', 'read')
),
segmented as (
  -- a key's life restarts after each end: nothing is carried across it
  select *, sum(if(__l_kind = 'end', 1, 0)) over (partition by {{ part }} order by {{ pos }} {{ upto }}) as __l_seg
  from ev
),
carried as (
  select
    *,
    {%- for c in nonkey %}
    last(if(__l_kind = 'put' and not array_contains(__l_absent, {{ loader_str(c) }}), named_struct('v', {{ loader_q(c) }}), null), true)
      over (partition by {{ part }}, __l_seg order by {{ pos }} {{ upto }}) as __l_a_{{ loop.index }}{% if not loop.last %},{% endif %}
    {%- endfor %}
    {%- if not nonkey %} 1 as __l_none{% endif %}
  from segmented
),
ended_state as (
  -- state of the old key just before each end
  select pg_lsn as __l_e_lsn, pg_seq as __l_e_seq
    {%- for c in nonkey %},
    if(__l_prev = 'put', __l_p_{{ loop.index }}, null) as __l_o_{{ loop.index }}
    {%- endfor %}
  from (
    select
      *,
      lag(__l_kind) over (partition by {{ part }} order by {{ pos }}) as __l_prev
      {%- for c in nonkey %},
      lag(__l_a_{{ loop.index }}) over (partition by {{ part }} order by {{ pos }}) as __l_p_{{ loop.index }}
      {%- endfor %}
    from carried
  )
  where __l_kind = 'end'
),
sent as (
  select
    s.*
    {%- for c in nonkey %},
    if(s.__l_kind = 'put',
       coalesce(if(array_contains(s.__l_absent, {{ loader_str(c) }}), null, named_struct('v', s.{{ loader_q(c) }})), e.__l_o_{{ loop.index }}),
       null) as __l_s_{{ loop.index }}
    {%- endfor %}
  from segmented s
  left join ended_state e on s.__l_kind = 'put' and s.pg_lsn = e.__l_e_lsn and s.pg_seq = e.__l_e_seq
),
states as (
  select
    *,
    lag(__l_kind) over (partition by {{ part }} order by {{ pos }}) as __l_prev
    {%- for c in nonkey %},
    last(__l_s_{{ loop.index }}, true) over (partition by {{ part }}, __l_seg order by {{ pos }} {{ upto }}) as __l_x_{{ loop.index }}
    {%- endfor %}
  from sent
),
before_after as (
  select
    *
    {%- for c in nonkey %},
    lag(__l_x_{{ loop.index }}) over (partition by {{ part }} order by {{ pos }}) as __l_y_{{ loop.index }}
    {%- endfor %}
  from states
),
puts as (select * from before_after where __l_kind = 'put'),
ends as (select * from before_after where __l_kind = 'end'),
joined as (
  select
    coalesce(p.pg_lsn, e.pg_lsn) as pg_lsn,
    coalesce(p.pg_seq, e.pg_seq) as pg_seq,
    coalesce(p.pg_txn_id, e.pg_txn_id) as pg_txn_id,
    coalesce(p.pg_txn_timestamp, e.pg_txn_timestamp) as pg_txn_timestamp,
    coalesce(p.pg_operation, e.pg_operation) as pg_operation,
    coalesce(if(e.pg_lsn is not null, e.__l_prev = 'put', p.__l_prev = 'put'), false) as existed_before,
    p.pg_lsn is not null as exists_after,
    p.pg_lsn is not null and e.pg_lsn is not null as key_changed,
    {%- for k in key %}
    if(p.pg_lsn is not null, p.{{ loader_q(k) }}, e.{{ loader_q(k) }}) as {{ loader_q(k) }},
    if(e.pg_lsn is not null, e.{{ loader_q(k) }}, if(p.__l_prev = 'put', p.{{ loader_q(k) }}, null)) as {{ loader_q(k ~ '__before') }},
    p.{{ loader_q(k) }} as {{ loader_q(k ~ '__after') }},
    {%- endfor %}
    {%- for c in nonkey %}
    if(e.pg_lsn is not null, if(e.__l_prev = 'put', e.__l_y_{{ loop.index }}, null), if(p.__l_prev = 'put', p.__l_y_{{ loop.index }}, null)).v as {{ loader_q(c ~ '__before') }},
    p.__l_x_{{ loop.index }}.v as {{ loader_q(c ~ '__after') }},
    {%- endfor %}
    p.__l_absent as pg_absent_columns
  from puts p
  full outer join ends e on p.pg_lsn = e.pg_lsn and p.pg_seq = e.pg_seq
)
select
  pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation,
  {%- for k in key %}
  {{ loader_q(k) }},
  {%- endfor %}
  existed_before, exists_after, key_changed,
  {%- for c in columns %}
  {{ loader_q(c ~ '__before') }}, {{ loader_q(c ~ '__after') }},
  {%- endfor %}
  filter(array(
    {%- for c in columns %}
    if(existed_before <> exists_after or not ({{ loader_q(c ~ '__before') }} <=> {{ loader_q(c ~ '__after') }}), {{ loader_str(c) }}, null){% if not loop.last %},{% endif %}
    {%- endfor %}
  ), x -> x is not null) as changed_columns,
  pg_absent_columns
from joined
union all
-- a TRUNCATE or a resync ends every row of the table; no key, nothing before or after
select
  pg_lsn, pg_seq, pg_txn_id, pg_txn_timestamp, pg_operation,
  {%- for k in key %}
  null,
  {%- endfor %}
  false, false, false,
  {%- for c in columns %}
  null, null,
  {%- endfor %}
  cast(array() as array<string>), cast(array() as array<string>)
from {{ history }}
where pg_operation in {{ loader_boundary_ops() }}
{% endmacro %}
