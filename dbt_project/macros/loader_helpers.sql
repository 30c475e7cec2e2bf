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
