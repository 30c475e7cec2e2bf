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

{#- Sorted positions of the TRUNCATEs in a history relation, as one array (TRUNCATEs are rare). -#}
{% macro loader_truncates(history) -%}
select coalesce(sort_array(collect_list(named_struct('lsn', pg_lsn, 'seq', pg_seq, 'ts', pg_txn_timestamp))), array()) as arr
from {{ history }}
where pg_operation = 'truncate'
{%- endmacro %}

{#- Number of TRUNCATEs strictly before a position. -#}
{% macro loader_epoch(arr, lsn, seq) -%}
size(filter({{ arr }}, t -> t.lsn < {{ lsn }} or (t.lsn = {{ lsn }} and t.seq < {{ seq }})))
{%- endmacro %}
