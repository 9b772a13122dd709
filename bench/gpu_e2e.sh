#!/usr/bin/env bash
# Run from the repository root with a gpu-bundle in .gpu (see ../shared/tools/README.md).
# GPU end to end: coordinator + worker (backend auto) + CLI on 127.0.0.1, seed job in BF16.
set -u
. .gpu/env.sh
export NCCL_NVLS_ENABLE=0
D=/tmp/e2e; mkdir -p $D
boulder-coordinator --listen 127.0.0.1:0 --db $D/db > $D/coord.log 2>&1 &
for i in $(seq 50); do grep -q listening $D/coord.log && break; sleep 0.2; done
ADDR=$(grep -oE '127\.0\.0\.1:[0-9]+' $D/coord.log | head -1)
boulder-worker --coordinator $ADDR --backend auto --work-dir $D/w > $D/worker.log 2>&1 &
for i in $(seq 50); do grep -q registered $D/worker.log && break; sleep 0.2; done
cat $D/worker.log
export BOULDER_COORDINATOR=$ADDR
boulder workers
boulder submit examples/minigpt.yaml --follow | tail -8
boulder get 1 | sed -n '1,22p'
boulder get 1 -o json | python3 -c "import json,sys; j=json.load(sys.stdin); r=j['latest_report']; print('state', j['state'], 'loss', r['loss'], 'peak', r['memory']['peak_bytes'], 'step_time', r['step_time_seconds'])"
kill %1 %2; wait
