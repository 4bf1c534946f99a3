// SPDX-License-Identifier: MIT OR GPL-2.0
//
// burst's XDP steering program (loaded by burst-io's AF_XDP port).
//
// RoCEv2 frames (UDP destination port 4791) to one of the device's addresses
// go to the AF_XDP socket bound to the receive queue they arrived on (slot
// = queue index): the kernel delivers a redirected frame only to a socket
// of its own queue. Each engine thread (lane) has the socket of one queue;
// a frame for a QP of another lane is handed over by the receiving lane in
// user space. `qpn_slots` (filled by the engine as QPs are created) says
// which lane owns a QPN: the program counts the frames that land on another
// lane's queue, and those for QPNs no lane owns (QP1, stale or unknown QPs:
// the engine counts and drops those itself). Everything else (ARP, other
// UDP, TCP, RoCE to other addresses, IP fragments) passes to the kernel
// untouched. Built for multi-buffer ("xdp.frags") so links with MTUs above a
// page (RoCE MTU 4096 frames) can attach it.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ROCEV2_PORT 4791
#define MAX_SLOTS 64
#define BTH_LEN 12

// Keep in step with burst-io's src/xdp.rs (`Stat`).
enum stat {
	STAT_PASSED = 0,	// handed to the kernel
	STAT_STEERED = 1,	// RoCEv2 to a local address, to an XSK slot
	STAT_UNKNOWN_QPN = 2,	// ...whose QPN no lane owns
	STAT_TRUNCATED = 3,	// ...too short for a BTH (burst counts and drops it)
	STAT_OTHER_LANE = 4,	// ...on the queue of a lane other than the QP's
	STAT_MAX = 5,
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Destination QPN -> slot (queue) of the owning engine thread.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 17);
	__type(key, __u32);
	__type(value, __u32);
} qpn_slots SEC(".maps");

// The device's addresses, IPv4 as IPv4-mapped IPv6 (a RoCE GID).
struct gid {
	__u8 b[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct gid);
	__type(value, __u32);
} local_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

// Frames steered to each slot.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} slot_hits SEC(".maps");

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

static __always_inline void count(void *map, __u32 key)
{
	__u64 *v = bpf_map_lookup_elem(map, &key);

	if (v)
		*v += 1;
}

static __always_inline int pass(void)
{
	count(&stats, STAT_PASSED);
	return XDP_PASS;
}

SEC("xdp.frags")
int burst_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct gid dst = {};
	struct udphdr *udp;
	__u16 proto;
	void *l3;

	if ((void *)(eth + 1) > end)
		return pass();
	proto = eth->h_proto;
	l3 = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q)) {
		struct vlan_hdr *v = l3;

		if ((void *)(v + 1) > end)
			return pass();
		proto = v->proto;
		l3 = v + 1;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;

		if ((void *)(ip + 1) > end)
			return pass();
		// Options or fragments: not RoCEv2 as senders emit it; the kernel
		// reassembles or drops.
		if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
		    (ip->frag_off & bpf_htons(0x3fff)))
			return pass();
		dst.b[10] = 0xff;
		dst.b[11] = 0xff;
		__builtin_memcpy(&dst.b[12], &ip->daddr, 4);
		udp = (void *)(ip + 1);
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > end)
			return pass();
		if (ip6->nexthdr != IPPROTO_UDP)
			return pass();
		__builtin_memcpy(dst.b, &ip6->daddr, 16);
		udp = (void *)(ip6 + 1);
	} else {
		return pass();
	}
	if ((void *)(udp + 1) > end || udp->dest != bpf_htons(ROCEV2_PORT))
		return pass();
	if (!bpf_map_lookup_elem(&local_addrs, &dst))
		return pass();

	__u32 slot = ctx->rx_queue_index;
	__u8 *bth = (void *)(udp + 1);

	if ((void *)(bth + BTH_LEN) > end) {
		count(&stats, STAT_TRUNCATED);
	} else {
		__u32 qpn = ((__u32)bth[5] << 16) | ((__u32)bth[6] << 8) | bth[7];
		__u32 *s = bpf_map_lookup_elem(&qpn_slots, &qpn);

		if (!s)
			count(&stats, STAT_UNKNOWN_QPN);
		else if (*s != slot)
			count(&stats, STAT_OTHER_LANE);
	}
	count(&stats, STAT_STEERED);
	if (slot < MAX_SLOTS)
		count(&slot_hits, slot);
	// No socket on this queue (more queues than lanes: `ethtool -L` the
	// interface to the lanes): drop rather than hand RoCE to a kernel that
	// has no RoCE stack on this address (it would answer ICMP unreachable).
	return bpf_redirect_map(&xsks, slot, XDP_DROP);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
