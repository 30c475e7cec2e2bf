{#- Quoting helpers: source table and column names may need quoting (spaces, capitals, quotes). -#}

{% macro loader_q(name) -%}
`{{ name | replace('`', '``') }}`
{%- endmacro %}

{% macro loader_str(value) -%}
'{{ value | replace('\\', '\\\\') | replace("'", "\\'") }}'
{%- endmacro %}

{#- Position order of changes: commit LSN, then the change's place in its transaction. -#}
{% macro loader_key_list(key, prefix='') -%}
{%- for k in key %}{{ prefix }}{{ loader_q(k) }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}

{#- The operations after which a table's earlier rows are gone: a TRUNCATE at the source, and a
    resync (a consistent re-snapshot that replaces the table's state). -#}
{% macro loader_boundary_ops() -%}
('truncate', 'resync')
{%- endmacro %}

{#- Sorted positions of the TRUNCATEs and resyncs in a history relation, as one array (they are rare). -#}
{% macro loader_truncates(history) -%}
select coalesce(sort_array(collect_list(named_struct('lsn', pg_lsn, 'seq', pg_seq, 'ts', pg_txn_timestamp, 'op', pg_operation))), array()) as arr
from {{ history }}
where pg_operation in {{ loader_boundary_ops() }}
{%- endmacro %}

{#- Number of TRUNCATEs and resyncs strictly before a position. -#}
{% macro loader_epoch(arr, lsn, seq) -%}
size(filter({{ arr }}, t -> t.lsn < {{ lsn }} or (t.lsn = {{ lsn }} and t.seq < {{ seq }})))
{%- endmacro %}
