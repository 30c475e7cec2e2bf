{#-
  No unchanged-TOAST placeholder survived: capture tools stand in for an unchanged TOASTed value
  with a marker text (Debezium: __debezium_unavailable_value). The loader must turn it into
  "absent" and keep the previous value, so the marker may never appear as data.
-#}
{% test loader_no_toast_placeholder(model, columns, placeholders=none) %}
{%- set marks = placeholders if placeholders is not none else var('loader_toast_placeholders') -%}
{%- for c in columns %}
select {{ loader_str(c) }} as column_name, count(*) as rows_with_placeholder
from {{ model }}
where cast({{ loader_q(c) }} as string) in ({% for m in marks %}{{ loader_str(m) }}{% if not loop.last %}, {% endif %}{% endfor %})
having count(*) > 0
{% if not loop.last %}union all{% endif %}
{%- endfor %}
{%- if not columns %}
select 'none' as column_name, 0 as rows_with_placeholder where false
{%- endif %}
{% endtest %}
