{#-
  Drift check: every history and current table in the catalog is declared as a dbt source, and
  every declared source exists in the catalog. Regenerate the sources (`loader dbt-sources`,
  or any `loader dbt ...` run) when this fails.
-#}
{%- set problems = [] -%}
{%- if execute -%}
  {%- for source_name, namespace in [('history', var('loader_history_namespace')), ('current', var('loader_current_namespace'))] -%}
    {%- set declared = [] -%}
    {%- for node in graph.sources.values() if node.source_name == source_name -%}
      {%- do declared.append(node.identifier | lower) -%}
    {%- endfor -%}
    {%- set found = [] -%}
    {%- for row in run_query('show tables in ' ~ loader_q(namespace)) if not row['isTemporary'] -%}
      {%- do found.append(row['tableName'] | lower) -%}
    {%- endfor -%}
    {%- for t in found if t not in declared -%}
      {%- do problems.append((source_name, t, 'in the catalog, not declared as a source')) -%}
    {%- endfor -%}
    {%- for t in declared if t not in found -%}
      {%- do problems.append((source_name, t, 'declared as a source, not in the catalog')) -%}
    {%- endfor -%}
  {%- endfor -%}
{%- endif -%}
{%- for p in problems %}
select {{ loader_str(p[0]) }} as source_name, {{ loader_str(p[1]) }} as table_name, {{ loader_str(p[2]) }} as problem
union all
{%- endfor %}
select 'none' as source_name, 'none' as table_name, 'none' as problem where false
