{#-
  PII retention: history rows older than the retention (commit time) hold no value in the columns
  tagged PII. Old versions must be redacted (or the rows removed) once the retention has passed.
-#}
{% test loader_pii_retention(model, columns, retention_days=none, timestamp_column='pg_txn_timestamp') %}
{%- set days = retention_days if retention_days is not none else var('loader_pii_retention_days') -%}
select pg_lsn, pg_seq, {{ loader_q(timestamp_column) }} as changed_at,
       filter(array(
         {%- for c in columns %}
         if({{ loader_q(c) }} is not null, {{ loader_str(c) }}, null){% if not loop.last %},{% endif %}
         {%- endfor %}
       ), x -> x is not null) as pii_columns_with_values
from {{ model }}
where {{ loader_q(timestamp_column) }} < current_timestamp() - interval {{ days | int }} days
  and ({% for c in columns %}{{ loader_q(c) }} is not null{% if not loop.last %} or {% endif %}{% endfor %})
{% endtest %}
