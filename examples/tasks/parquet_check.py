#!/usr/bin/env python3
"""A quality check for `forte pull` ([[task]] at = "core", per = "file"): is this a Parquet
file, as `forte ingest` writes them, with the columns the analysts expect?

A recording from `forte ingest` is a Parquet file: it starts and ends with the magic bytes PAR1,
its footer opens, and it has the schema's columns. A file cut short, overwritten or mislabelled
at the source fails here, at the core, before engineers can see it: its batch goes to
quarantine with the reason this prints.

    [[task]]
    name = "parquet-check"
    at = "core"
    per = "file"
    command = ["python3", "examples/tasks/parquet_check.py", "--columns", "time,s00,s01"]
    timeout = "2m"
    retries = 1

forte tells the file in FORTE_FILE and its path in the batch in FORTE_PATH. Exit 0 passes;
exit 1 refuses the file (forte does not retry a refusal); anything else (here: pyarrow
missing) is the check failing, which forte retries and then reports.

Needs pyarrow. Files not named *.parquet pass unchecked.
"""

import argparse
import os
import sys

MAGIC = b"PAR1"


def refuse(path: str, why: str):
    print(f"{path}: {why}")
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--columns", default="", help="comma-separated column names every file must have")
    args = ap.parse_args()
    file, path = os.environ["FORTE_FILE"], os.environ.get("FORTE_PATH", os.environ["FORTE_FILE"])
    if not path.endswith(".parquet"):
        print(f"{path}: not a .parquet file, not checked")
        return
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
    if head != MAGIC:
        refuse(path, f"bad header: starts with {head!r}, not {MAGIC!r}: not a Parquet file")
    if tail != MAGIC:
        refuse(path, f"bad footer: ends with {tail!r}, not {MAGIC!r}: cut short?")
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        print(f"cannot check {path}: {e} (pip install pyarrow)")
        sys.exit(2)
    try:
        meta = pq.ParquetFile(file)
    except Exception as e:  # noqa: BLE001 - any failure to open is the verdict
        refuse(path, f"does not open as Parquet: {e}")
    have = set(meta.schema_arrow.names)
    wanted = [c for c in args.columns.split(",") if c]
    missing = [c for c in wanted if c not in have]
    if missing:
        refuse(path, f"missing columns {', '.join(missing)} (has {', '.join(sorted(have))})")
    print(f"{path}: Parquet, {meta.metadata.num_rows} rows, {meta.metadata.num_row_groups} row groups, columns ok")


if __name__ == "__main__":
    main()
