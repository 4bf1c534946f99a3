/* The DPDK headers burst-io's DPDK port binds (bindgen, at build time). */
#include <rte_dmadev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* rte_errno is a per-lcore TLS macro: a function reads it. */
static inline int burst_rte_errno(void) { return rte_errno; }
