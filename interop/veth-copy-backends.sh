#!/bin/bash
# The unmodified rdma-core pingpongs (data checked with -c) and perftest
# tools over the veth pair burstbb1/burstbb2 (198.18.0.101/.102, as
# `cargo xtask dropin --veth` makes it) with a copy backend:
#   interop/veth-copy-backends.sh cpu|cpu-plain|dsa-model|dmadev
# The drop-in must be in $DROPIN (default /tmp/dropin: libibverbs.so.1 ->
# target/release/libburst_ibverbs.so, built with --features dpdk for dmadev).
# Every copy is offloaded (BURST_COPY_MIN=0); the DSA model faults every 7th
# descriptor; dmadev uses DPDK's dma_skeleton.
export LD_LIBRARY_PATH=${DROPIN:-/tmp/dropin}
export BURST_COPY=$1 BURST_COPY_MIN=${BURST_COPY_MIN:-0}
export BURST_DPDK="--vdev=dma_skeleton dma=dma_skeleton"
export BURST_DSA_MODEL_FAULT_EVERY=7
pass=0; fail=0; port=19000
run() { # name, server cmd, client cmd
  port=$((port+1))
  ( BURST_ADDR=198.18.0.101 timeout 60 ip netns exec burstbb1 $2 -p $port > /tmp/vd.srv 2>&1 ) &
  local s=$!
  sleep 1.5
  if BURST_ADDR=198.18.0.102 timeout 60 ip netns exec burstbb2 $3 -p $port 198.18.0.101 > /tmp/vd.cli 2>&1 && wait $s; then
    pass=$((pass+1)); echo "ok   $1: $(tail -1 /tmp/vd.cli)"
  else
    fail=$((fail+1)); echo "FAIL $1"; tail -n 3 /tmp/vd.cli /tmp/vd.srv
  fi
}
run "rc_pingpong -c 64K" "ibv_rc_pingpong -c -g 1 -s 65536 -n 300" "ibv_rc_pingpong -c -g 1 -s 65536 -n 300"
run "ud_pingpong -c 2K" "ibv_ud_pingpong -c -g 1 -s 2048 -n 300" "ibv_ud_pingpong -c -g 1 -s 2048 -n 300"
run "srq_pingpong -c 8K" "ibv_srq_pingpong -c -g 1 -s 8192 -n 300" "ibv_srq_pingpong -c -g 1 -s 8192 -n 300"
run "uc_pingpong -c 4K" "ibv_uc_pingpong -c -g 1 -s 4096 -n 300" "ibv_uc_pingpong -c -g 1 -s 4096 -n 300"
run "ib_write_bw 64K" "ib_write_bw -x 1 -s 65536 -n 2000" "ib_write_bw -x 1 -s 65536 -n 2000"
run "ib_read_bw 64K" "ib_read_bw -x 1 -s 65536 -n 2000" "ib_read_bw -x 1 -s 65536 -n 2000"
run "ib_send_bw 64K" "ib_send_bw -x 1 -s 65536 -n 2000" "ib_send_bw -x 1 -s 65536 -n 2000"
run "ib_atomic_bw" "ib_atomic_bw -x 1 -n 2000" "ib_atomic_bw -x 1 -n 2000"
echo "veth $1: $pass passed, $fail failed"
