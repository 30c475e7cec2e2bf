{#-
  Erased subjects are absent everywhere: no row of this relation carries, in this column (and, for
  history tables with in_old_key, in the old key of its updates and deletes), a value whose salted
  hash is listed in the loader's erased_keys table for that source column. The lake keeps only the
  hashes of erased values (see `loader erase`); the salt is a property of the erased_keys table.
  Without any erasure yet, the audit has nothing to check and passes.
-#}
{% test loader_erased_subjects_absent(model, column_name, source_table, source_column, in_old_key=false) %}
{%- set salt = namespace(value='') -%}
{%- set erased = loader_q(var('loader_loader_namespace')) ~ '.erased_keys' -%}
{%- if execute -%}
  {%- for row in run_query("SHOW TABLES IN " ~ loader_q(var('loader_loader_namespace'))) if row['tableName'] == 'erased_keys' -%}
    {%- for prop in run_query("SHOW TBLPROPERTIES " ~ erased) if prop[0] == 'loader.erasure-salt' -%}
      {%- set salt.value = prop[1] -%}
    {%- endfor -%}
  {%- endfor -%}
{%- endif %}
{%- if salt.value %}
with erased as (
  select value_hash from {{ erased }}
  where source_table = {{ loader_str(source_table) }} and source_column = {{ loader_str(source_column) }}
)
select e.value_hash, {{ loader_str(column_name) }} as column_name
from {{ model }} m
join erased e
  on sha2(concat({{ loader_str(salt.value) }}, cast(m.{{ loader_q(column_name) }} as string)), 256) = e.value_hash
  {%- if in_old_key %}
  or sha2(concat({{ loader_str(salt.value) }}, from_json(m.pg_old_key, 'map<string,string>')[{{ loader_str(column_name) }}]), 256) = e.value_hash
  {%- endif %}
{%- else %}
select cast(null as string) as value_hash, {{ loader_str(column_name) }} as column_name where false
{%- endif %}
{% endtest %}
