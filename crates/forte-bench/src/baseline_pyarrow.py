"""Baseline (a) of `forte-bench ingest`: pyarrow done well, on the same row bytes.

numpy reads the rows in place (frombuffer with the row layout), each column is made contiguous
and handed to pyarrow, and one write_table writes them with the same row-group size, encodings,
codec, statistics and page layout as forte. Prints JSON: the seconds of each run and the bytes written.

Usage: python3 baseline_pyarrow.py ROWS SCHEMA_JSON OUT CODEC LEVEL BSS(0|1) ROWS_PER_GROUP RUNS PAGES

PAGES: "forte" for forte's page layout (pages of up to 1 MiB, one per column and row group at
the default sizes), "default" for pyarrow's (pages cut at 20 000 rows).
"""

import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TYPES = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8"}


def main():
    rows_file, schema, out, codec, level, bss, group, runs, pages = sys.argv[1:10]
    schema, bss, group, runs = json.loads(schema), bss == "1", int(group), int(runs)
    ts = schema["timestamp"]
    fields = ([(ts, "<i8")] if ts else []) + [(n, TYPES[k]) for n, k in schema["columns"]]
    floats = [n for n, k in schema["columns"] if k.startswith("float")]
    encoding = {n: ("BYTE_STREAM_SPLIT" if bss else "PLAIN") for n in floats}
    if ts:
        encoding[ts] = "DELTA_BINARY_PACKED"
    layout = {"data_page_size": 1 << 20, "max_rows_per_page": group} if pages == "forte" else {}
    with open(rows_file, "rb") as f:
        raw = f.read()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        rows = np.frombuffer(raw, dtype=np.dtype(fields))
        arrays = []
        for name, _ in fields:
            column = np.ascontiguousarray(rows[name])
            if name == ts:
                arrays.append(pa.array(column, type=pa.timestamp("ns", tz="UTC")))
            else:
                arrays.append(pa.array(column))
        table = pa.Table.from_arrays(arrays, names=[n for n, _ in fields])
        pq.write_table(
            table,
            out,
            row_group_size=group,
            compression=codec,
            compression_level=int(level) if codec == "zstd" else None,
            use_dictionary=False,
            column_encoding=encoding,
            write_statistics=schema["statistics"],
            **layout,
        )
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds, "bytes": os.path.getsize(out)}))


if __name__ == "__main__":
    main()
