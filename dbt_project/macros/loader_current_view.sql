{#-
  Simple-style current view: one row per key, deletes excluded. The loader's incremental MERGE
  keeps the current table in that state, so the view reads it instead of scanning history.
-#}
{% macro loader_current_view(current, columns) %}
select
  {%- for c in columns %}
  {{ loader_q(c) }},
  {%- endfor %}
  pg_lsn,
  pg_seq,
  pg_txn_timestamp
from {{ current }}
{% endmacro %}
