{#- No duplicate keys: at most one row per primary key (current tables, current views). -#}
{% test loader_unique_key(model, key) %}
select {{ loader_key_list(key) }}, count(*) as rows_with_key
from {{ model }}
group by {{ loader_key_list(key) }}
having count(*) > 1
{% endtest %}
