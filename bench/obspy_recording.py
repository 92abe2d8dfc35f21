#!/usr/bin/env python3
"""Turn the real seismometer recordings bundled with ObsPy into a `forte ingest` recording.

ObsPy ships hundreds of waveform files as test data (MiniSEED, SAC, GSE2, SEISAN, ...). This
script reads every one of them, drops traces whose samples duplicate another's (the same data
often ships in several formats), groups the rest by sampling rate and takes the group with the
most samples (no resampling). Those traces, longest first, are concatenated end to end into one
sample stream, which is cut into N (--columns) equal contiguous stretches: column k holds samples
[k*rows, (k+1)*rows) of the stream. Samples are cast to float32 and otherwise left as recorded.
If the stream is shorter than N * --min-rows it wraps around (the output says by how much).
Row i is stamped with the first trace's start time + round(i * 1e9 / rate) nanoseconds.

Outputs
  OUT_DIR/obspy.bin          b"FORTE-INGEST 1 obspy\\n", then rows of int64 ns + N float32
  OUT_DIR/obspy.schema.toml  schema for `forte ingest --from-file` (columns c00..c{N-1})

Needs obspy and numpy: `pip install obspy` (numpy comes with it), e.g. in a virtualenv:
  python3 -m venv /tmp/obspy-venv && /tmp/obspy-venv/bin/pip install obspy numpy

Usage: bench/obspy_recording.py OUT_DIR [--min-rows 200000] [--columns 8]
"""

import argparse
import collections
import hashlib
import sys
import warnings
from pathlib import Path

try:
    import numpy as np
    import obspy
except ImportError as e:
    sys.exit(f"error: {e.name} is missing; install it with `pip install obspy numpy`, e.g.\n"
             "  python3 -m venv /tmp/obspy-venv && /tmp/obspy-venv/bin/pip install obspy numpy")


def bundled_traces():
    """Yield (path relative to the obspy package, trace) for every distinct bundled trace."""
    base = Path(obspy.__file__).parent
    seen = set()
    for path in sorted(p for p in base.glob("**/tests/data/**/*") if p.is_file()):
        try:
            stream = obspy.read(str(path))
        except Exception:  # not a waveform file (events, inventories, corrupt-on-purpose, ...)
            continue
        for tr in stream:
            data = tr.data
            if tr.stats.npts == 0 or np.ma.isMaskedArray(data) or data.dtype.kind not in "iuf":
                continue
            digest = hashlib.sha1(data.astype(np.float32).tobytes()).digest()
            if digest not in seen:
                seen.add(digest)
                yield str(path.relative_to(base)), tr


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--min-rows", type=int, default=200_000)
    ap.add_argument("--columns", type=int, default=8)
    args = ap.parse_args()
    n = args.columns

    warnings.filterwarnings("ignore")  # obspy warns loudly about the odd test files
    groups = collections.defaultdict(list)
    for path, tr in bundled_traces():
        groups[tr.stats.sampling_rate].append((path, tr))
    rate, traces = max(groups.items(), key=lambda kv: sum(tr.stats.npts for _, tr in kv[1]))
    traces.sort(key=lambda pt: (-pt[1].stats.npts, pt[0], pt[1].id))

    stream = np.concatenate([tr.data.astype(np.float32) for _, tr in traces])
    rows = max(args.min_rows, len(stream) // n)
    wrapped = n * rows - len(stream)
    columns = np.resize(stream, n * rows).reshape(n, rows)  # np.resize repeats from the start

    t0 = traces[0][1].stats.starttime.ns
    out = np.empty(rows, dtype=[("t", "<i8"), ("c", "<f4", (n,))])
    out["t"] = t0 + np.round(np.arange(rows, dtype=np.float64) * 1e9 / rate).astype(np.int64)
    out["c"] = columns.T

    args.out_dir.mkdir(parents=True, exist_ok=True)
    bin_path = args.out_dir / "obspy.bin"
    with open(bin_path, "wb") as f:
        f.write(b"FORTE-INGEST 1 obspy\n")
        out.tofile(f)
    schema_path = args.out_dir / "obspy.schema.toml"
    schema_path.write_text(
        f'timestamp = "time"\n[[column]]\nname = "c"\ncount = {n}\ntype = "float32"\n')

    per_file = collections.Counter()
    for path, tr in traces:
        per_file[path] += tr.stats.npts
    print(f"obspy {obspy.__version__}: {len(traces)} distinct traces at {rate:g} Hz "
          f"({len(stream)} samples) from {len(per_file)} files, longest first:")
    for path, samples in per_file.most_common():
        print(f"  {samples:>8}  {path}")
    print(f"concatenated and cut into {n} columns of {rows} consecutive samples"
          + (f"; wrapped around by {wrapped} samples ({wrapped / len(stream):.2%})"
             if wrapped > 0 else f"; {-wrapped} trailing samples unused"))
    starts = np.cumsum([0] + [tr.stats.npts for _, tr in traces])
    digits = max(2, len(str(n - 1)))  # forte names the columns c00, c01, ...
    for k in range(n):
        at = (k * rows) % len(stream)
        j = np.searchsorted(starts, at, side="right") - 1
        print(f"  c{k:0{digits}d} starts at sample {at - starts[j]} of {traces[j][1].id}"
              f" ({traces[j][0]})")
    print(f"row 0 at {traces[0][1].stats.starttime}, then every {1e9 / rate:g} ns")
    size = bin_path.stat().st_size
    print(f"wrote {bin_path}: {rows} rows x (int64 + {n} float32) = {size} bytes")
    print(f"wrote {schema_path}")


if __name__ == "__main__":
    main()
