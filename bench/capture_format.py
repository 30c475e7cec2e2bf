"""Benchmark: landing file format, gzip JSON lines (current: ISA-L level 1; zlib levels 1 and 6) vs Avro (fastavro).

Measures encode and decode time and file size for the same ChangeRecords, in-process, no database.
Decoding is what Spark executors do per landing file (mapInArrow), so decode speed matters most;
pyspark's package has no Avro reader (spark-avro is a separate jar), so Avro would be decoded by fastavro in executors too.

    python -m bench.capture_format           # 200,000 changes
"""

from __future__ import annotations

import gzip
import io
import os
import random
import time

from isal import igzip

from loader.landing.records import ChangeRecord, Column

AVRO_SCHEMA = {
    "type": "record",
    "name": "LandingChange",
    "namespace": "lakehouse.loader",
    "fields": [
        {"name": "op", "type": "string"},
        {"name": "lsn", "type": "long"},
        {"name": "seq", "type": "long"},
        {"name": "xid", "type": "long"},
        {"name": "ts", "type": "string"},
        {"name": "change_lsn", "type": "long"},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {
            "name": "columns",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Column",
                    "fields": [
                        {"name": "name", "type": "string"},
                        {"name": "type", "type": "string"},
                        {"name": "value", "type": ["null", "string"]},
                    ],
                },
            },
        },
        {"name": "identity", "type": {"type": "array", "items": "Column"}},
        {"name": "pk", "type": {"type": "array", "items": "string"}},
    ],
}


def sample(n: int) -> list[ChangeRecord]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        out.append(
            ChangeRecord(
                op=rng.choice("IUD"),
                commit_lsn=0x16B374D848 + i // 5 * 200,
                seq=i % 5 + 1,
                xid=1000 + i // 5,
                ts="2024-01-31 12:00:00.123456+00",
                schema="public",
                table="accounts",
                change_lsn=0x16B374D848 + i * 40,
                columns=[
                    Column("id", "bigint", str(i)),
                    Column("customer_id", "bigint", str(rng.randrange(10**6))),
                    Column("balance", "numeric(18,2)", f"{rng.randrange(10**8)}.{rng.randrange(100):02d}"),
                    Column("status", "text", rng.choice(["open", "closed", "frozen"])),
                    Column("opened_at", "timestamp with time zone", "2023-05-01 08:30:00+00"),
                    Column("note", "text", None if rng.random() < 0.5 else f"note {rng.randrange(1000)}"),
                ],
                identity=[Column("id", "bigint", str(i))] if i % 3 else [],
                pk=["id"],
            )
        )
    return out


def _avro_doc(r: ChangeRecord) -> dict:
    return {
        "op": r.op,
        "lsn": r.commit_lsn,
        "seq": r.seq,
        "xid": r.xid,
        "ts": r.ts,
        "change_lsn": r.change_lsn,
        "schema": r.schema,
        "table": r.table,
        "columns": [{"name": c.name, "type": c.type, "value": c.value} for c in r.columns],
        "identity": [{"name": c.name, "type": c.type, "value": c.value} for c in r.identity],
        "pk": r.pk,
    }


def run() -> None:
    import fastavro

    n = int(os.environ.get("BENCH_CHANGES", "200000"))
    recs = sample(n)
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    rows = []

    # Landing files are written by ISA-L at GZIP_LEVEL (1); zlib's levels 1 and 6 for comparison.
    for name, gz_module, level in (("isal", igzip, 1), ("zlib", gzip, 1), ("zlib", gzip, 6)):
        t = time.perf_counter()
        buf = io.BytesIO()
        with gz_module.GzipFile(fileobj=buf, mode="wb", compresslevel=level) as gz:
            gz.write(b"".join(r.to_json_bytes() + b"\n" for r in recs))
        json_bytes = buf.getvalue()
        rows.append((f"jsonl+{name}{level}", "encode", time.perf_counter() - t, len(json_bytes)))
        t = time.perf_counter()
        back = [ChangeRecord.from_json(line) for line in gz_module.decompress(json_bytes).splitlines()]
        rows.append((f"jsonl+{name}{level}", "decode", time.perf_counter() - t, len(json_bytes)))
        assert len(back) == n

    for codec in ("deflate", "null"):
        t = time.perf_counter()
        buf = io.BytesIO()
        fastavro.writer(buf, parsed, (_avro_doc(r) for r in recs), codec=codec)
        avro_bytes = buf.getvalue()
        rows.append((f"avro+{codec}", "encode", time.perf_counter() - t, len(avro_bytes)))
        t = time.perf_counter()
        back_docs = list(fastavro.reader(io.BytesIO(avro_bytes)))
        back2 = [
            ChangeRecord(
                op=d["op"],
                commit_lsn=d["lsn"],
                seq=d["seq"],
                xid=d["xid"],
                ts=d["ts"],
                schema=d["schema"],
                table=d["table"],
                change_lsn=d["change_lsn"],
                columns=[Column(c["name"], c["type"], c["value"]) for c in d["columns"]],
                identity=[Column(c["name"], c["type"], c["value"]) for c in d["identity"]],
                pk=d["pk"],
            )
            for d in back_docs
        ]
        rows.append((f"avro+{codec}", "decode", time.perf_counter() - t, len(avro_bytes)))
        assert back2 == back

    print(f"capture_format: {n:,} change records (6 columns), encode/decode in one Python process")
    for fmt, step, secs, size in rows:
        print(f"  {fmt:<13} {step:<6} {secs:6.2f}s  {n / secs:>10,.0f} rec/s  {size / 1e6:7.2f} MB")


if __name__ == "__main__":
    run()
