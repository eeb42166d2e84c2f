#!/usr/bin/env bash
# Cold streaming throughput of smoe against fio on the same file, side by side,
# and the page-cache growth of a direct-I/O stream.
#
#   scripts/bench-io.sh [DIR]          (root: it drops the page cache)
#
# It writes a synthetic vault larger than the ring (SIZE_GB, default 4) under
# DIR (default: target/bench-io), then ROUNDS times (default 2), alternating:
#   - drop the page cache, `smoe bench --mode scan` (every blob once, in file
#     order, WORKERS direct-I/O workers, 2 × WORKERS reads in flight);
#   - drop the page cache, fio reading the same file with the same block size
#     (the vault's padded blob size), --direct=1, numjobs = WORKERS, each job a
#     contiguous 1/WORKERS of the file, psync engine (pread, as smoe's workers).
# It prints each run, the ratio of the means, and how much `Cached` in
# /proc/meminfo grew during each smoe run relative to the bytes it read.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=${1:-target/bench-io}
SIZE_GB=${SIZE_GB:-4}
WORKERS=${WORKERS:-16}
ROUNDS=${ROUNDS:-2}
BLOB_KIB=${BLOB_KIB:-2048}

if ! command -v fio >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends fio
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "needs root to drop the page cache between runs" >&2
  exit 1
fi

cargo build --release --quiet
SMOE=target/release/smoe
mkdir -p "$DIR"
VAULT="$DIR/vault-${SIZE_GB}g"
EXPERTS=64
LAYERS=$(( SIZE_GB * 1024 * 1024 / BLOB_KIB / EXPERTS ))
if [ ! -f "$VAULT/experts.smoe" ]; then
  "$SMOE" synth "$VAULT" --layers "$LAYERS" --experts "$EXPERTS" --blob-kib "$BLOB_KIB" --seed 7 >/dev/null
fi
FILE="$VAULT/experts.smoe"
FILE_BYTES=$(stat -c %s "$FILE")
BS=$(( BLOB_KIB * 1024 ))
PER_JOB=$(( FILE_BYTES / WORKERS / BS * BS ))

drop_cache() { sync; echo 3 > /proc/sys/vm/drop_caches; }
cached_bytes() { awk '/^Cached:/ {print $2 * 1024}' /proc/meminfo; }

echo "machine: $(nproc) cores, $(uname -sr), $(df -h "$DIR" | awk 'NR==2 {print $1}')"
echo "vault: $FILE, $FILE_BYTES bytes, $LAYERS layers x $EXPERTS experts, blobs of $BLOB_KIB KiB"
echo "workers/numjobs: $WORKERS, block size: $BS"

SMOE_RESULTS=()
FIO_RESULTS=()
for round in $(seq 1 "$ROUNDS"); do
  drop_cache
  before=$(cached_bytes)
  json=$("$SMOE" bench "$VAULT" --mode scan --workers "$WORKERS" --direct require --json)
  after=$(cached_bytes)
  gbs=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["gb_per_s"])' "$json")
  read_bytes=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["bytes_read"])' "$json")
  growth=$(python3 -c 'import sys; b,a,r=map(int,sys.argv[1:]); print(f"{100*(a-b)/r:.2f}")' "$before" "$after" "$read_bytes")
  resident=$(fincore --bytes --noheadings --output RES "$FILE" | tr -d ' ')
  echo "round $round smoe: $gbs GB/s; the vault's own pages in the page cache afterwards: $resident bytes" \
    "($(python3 -c 'import sys; print(f"{100*int(sys.argv[1])/int(sys.argv[2]):.3f}")' "$resident" "$read_bytes")% of $read_bytes read);" \
    "Cached grew by $(( (after - before) / 1048576 )) MiB system-wide = ${growth}% (includes other processes)"
  SMOE_RESULTS+=("$gbs")

  drop_cache
  fjson=$(fio --name=vault --filename="$FILE" --readonly --rw=read --bs="$BS" --direct=1 \
    --ioengine=psync --numjobs="$WORKERS" --size="$PER_JOB" --offset_increment="$PER_JOB" \
    --group_reporting --output-format=json)
  fgbs=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["jobs"][0]["read"]["bw_bytes"]/1e9)' "$fjson")
  echo "round $round fio:  $fgbs GB/s"
  FIO_RESULTS+=("$fgbs")
done

python3 - "${SMOE_RESULTS[*]}" "${FIO_RESULTS[*]}" <<'EOF'
import sys
s = [float(x) for x in sys.argv[1].split()]
f = [float(x) for x in sys.argv[2].split()]
ms, mf = sum(s) / len(s), sum(f) / len(f)
print(f"mean: smoe {ms:.3f} GB/s, fio {mf:.3f} GB/s, smoe/fio = {ms / mf:.3f}")
EOF
