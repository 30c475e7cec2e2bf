{#-
  Commit order in a history table: no two changes share a position (pg_lsn, pg_seq); all changes
  of one commit LSN belong to one transaction with one commit time; within a transaction the
  WAL position of the changes (pg_change_lsn) never goes backwards as pg_seq grows. Park rows
  the load writes (a quarantined change, a damaged file) stand at the start of a transaction
  but are not part of it, so the transaction checks leave them out.
-#}
{% test loader_history_order(model) %}
select pg_lsn, pg_seq, 'duplicate position (pg_lsn, pg_seq)' as problem
from {{ model }}
group by pg_lsn, pg_seq
having count(*) > 1
union all
select pg_lsn, cast(null as bigint), 'one commit LSN with several transactions or commit times'
from {{ model }}
where pg_operation <> 'park'
group by pg_lsn
having count(distinct pg_txn_id) > 1 or count(distinct pg_txn_timestamp) > 1
union all
select pg_lsn, pg_seq, 'pg_change_lsn goes backwards within the transaction'
from (
  select pg_lsn, pg_seq, pg_change_lsn,
         lag(pg_change_lsn) over (partition by pg_lsn order by pg_seq) as previous_change_lsn
  from {{ model }}
  where pg_operation <> 'park'
)
where pg_change_lsn < previous_change_lsn
{% endtest %}
