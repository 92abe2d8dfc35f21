"""Reads Parquet files written by `forte ingest` with a stock reader and writes their rows
back in the wire format, so the test can compare them with what was sent, bit for bit.

Usage: readback.py pyarrow|duckdb SCHEMA_JSON OUT FILE...

SCHEMA_JSON: {"timestamp": "time" or null, "columns": [["name", "float32"], ...]}
With pyarrow it also prints, as JSON, each column's encodings from the file metadata.
"""

import json
import sys

import numpy as np

TYPES = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8"}


def main():
    engine, schema, out, files = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
    fields = ([(schema["timestamp"], "<i8")] if schema["timestamp"] else []) + [
        (name, TYPES[kind]) for name, kind in schema["columns"]
    ]
    rows = []
    encodings = {}
    for f in files:
        if engine == "pyarrow":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                for c in range(meta.num_columns):
                    col = meta.row_group(g).column(c)
                    encodings.setdefault(col.path_in_schema, set()).update(col.encodings)
            table = pq.read_table(f)
            columns = {}
            for name, _ in fields:
                arr = table.column(name).combine_chunks()
                if name == schema["timestamp"]:
                    arr = arr.cast("int64")
                columns[name] = arr.to_numpy(zero_copy_only=False)
        else:
            import duckdb

            select = ", ".join(
                f"epoch_ns({n}) AS {n}" if n == schema["timestamp"] else n for n, _ in fields
            )
            columns = duckdb.sql(f"SELECT {select} FROM read_parquet('{f}')").fetchnumpy()
        n = len(next(iter(columns.values())))
        block = np.empty(n, dtype=np.dtype(fields))
        for name, kind in fields:
            block[name] = np.asarray(columns[name]).astype(kind, copy=False)
        rows.append(block.tobytes())
    with open(out, "wb") as o:
        o.write(b"".join(rows))
    if engine == "pyarrow":
        print(json.dumps({k: sorted(v) for k, v in encodings.items()}))


if __name__ == "__main__":
    main()
