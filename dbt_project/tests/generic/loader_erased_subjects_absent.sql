{#-
  Erased subjects are absent everywhere: no row of this relation carries the id of a subject
  listed in the erased_subjects seed (subject_type, subject_id) in this column, nor, for history
  tables (in_old_key), in the old key of its updates and deletes.
-#}
{% test loader_erased_subjects_absent(model, column_name, subject_type, erased, in_old_key=false) %}
with erased as (
  select subject_id from {{ erased }} where subject_type = {{ loader_str(subject_type) }}
)
select e.subject_id, {{ loader_str(column_name) }} as column_name
from {{ model }} m
join erased e
  on cast(m.{{ loader_q(column_name) }} as string) = e.subject_id
  {%- if in_old_key %}
  or from_json(m.pg_old_key, 'map<string,string>')[{{ loader_str(column_name) }}] = e.subject_id
  {%- endif %}
{% endtest %}
