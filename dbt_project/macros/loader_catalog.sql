{#-
  The docs catalog (`dbt docs generate`) of Iceberg tables.

  dbt-spark lists a schema's relations with SHOW TABLE EXTENDED, which Spark 3.5 refuses for v2
  (Iceberg) tables (SPARK-33393). It then falls back to SHOW TABLES and this macro for each table,
  joins the rows into "name: value" lines, and reads the catalog's columns from them with a pattern
  for SHOW TABLE EXTENDED's schema lines (" |-- id: int (nullable = true)"), which a DESCRIBE row
  never matches: catalog.json had no columns, so no table at all. This override of dbt-spark's macro
  (a root project's macro wins) gives the column rows, those before the first blank or '#' row, in
  that form, and every other row (Type, Provider, Owner, ...) as DESCRIBE gives it.
  Fixed in dbt-spark by dbt-labs/dbt-adapters#1870 (falls back to DESCRIBE when no column parses);
  harmless with that fix, and removable once the pinned dbt-spark has it.
-#}
{% macro describe_table_extended_without_caching(table_name) %}
  {% call statement('describe_table_extended_without_caching', fetch_result=True) -%}
    describe extended {{ table_name }}
  {% endcall %}
  {% set rows = [] %}
  {% set section = namespace(columns=true) %}
  {% for row in load_result('describe_table_extended_without_caching').table %}
    {% set name = row[0] or '' %}
    {% if name == '' or name.startswith('#') %}
      {% set section.columns = false %}
    {% endif %}
    {% if section.columns %}
      {% do rows.append([' |-- ' ~ name, (row[1] or '') ~ ' (nullable = true)', row[2]]) %}
    {% else %}
      {% do rows.append([name, row[1] or '', row[2]]) %}
    {% endif %}
  {% endfor %}
  {% do return(rows) %}
{% endmacro %}
