/*
 * mw-peer: memory windows between two hosts, built against the system
 * libibverbs; run on burst's drop-in or on kernel RXE, either side.
 *
 * The server registers 8 KiB with MW_BIND and no remote right of its own,
 * binds a type 1 window (ibv_bind_mw) over bytes 1024..2048 for RDMA WRITE
 * and a type 2 window (IBV_WR_BIND_MW) over bytes 4096..8192 for RDMA READ,
 * and hands out both rkeys. The client WRITEs through the first, READs
 * through the second (checking the bytes), then SENDs WITH INVALIDATE the
 * second's rkey; the server checks the bytes written, the receive's
 * invalidated rkey, and answers; the client's last READ through the
 * invalidated rkey must fail with a remote access error.
 *
 * One text line each way over TCP: "QPN PSN GID\n" (hex GID, 32 digits),
 * then server -> client "RKEY1 ADDR1 RKEY2 ADDR2\n", client -> server
 * "check\n", server -> client "ok\n" or "bad WHY\n".
 *
 * usage: mw-peer [-d DEVICE] [-g GID_INDEX] [-p PORT] [SERVER_HOST]
 * Prints "mw-peer: ok ..." and exits 0 when every check passed.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PEER "mw-peer"
#include "peer.h"

#define SIZE 8192

static struct ibv_wc next_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc = { .status = -1 };

	/* 30 s: an emulated VM is slow. */
	for (int i = 0; i < 300000; i++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
		usleep(100);
	}
	wc.status = -1;
	return wc;
}

static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
		struct ibv_sge *sge, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = sge, .num_sge = 1,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		return -2;
	return next_wc(cq).status;
}

int main(int argc, char **argv)
{
	const char *devname = NULL;
	int gidx = 0, port = 18600, opt;

	while ((opt = getopt(argc, argv, "d:g:p:")) != -1) {
		switch (opt) {
		case 'd': devname = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'p': port = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-d DEV] [-g GIDX] [-p PORT] [HOST]\n", argv[0]);
			return 2;
		}
	}
	const char *host = optind < argc ? argv[optind] : NULL;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;

	for (int i = 0; list && list[i]; i++)
		if (!devname || !strcmp(ibv_get_device_name(list[i]), devname))
			dev = dev ? dev : list[i];
	if (!dev)
		die("no device %s", devname ? devname : "");
	int rxe = !strncmp(ibv_get_device_name(dev), "rxe", 3);
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	static char buf[SIZE];
	struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, SIZE, IBV_ACCESS_LOCAL_WRITE |
						    (host ? 0 : IBV_ACCESS_MW_BIND)) : NULL;
	struct ibv_qp_init_attr qi = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &qi) : NULL;

	if (!qp)
		die("set-up (context, PD, CQ, MR with MW_BIND, RC QP)");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS))
		die("INIT");
	union ibv_gid gid;

	if (ibv_query_gid(ctx, 1, gidx, &gid))
		die("query GID %d", gidx);
	int fd = tcp(host, port);
	char line[256], hex[33];
	uint32_t psn = 0x1234 + (host ? 0 : 0x100);

	for (int i = 0; i < 16; i++)
		sprintf(hex + 2 * i, "%02x", gid.raw[i]);
	snprintf(line, sizeof(line), "%06x %06x %s\n", qp->qp_num, psn, hex);
	sock_send(fd, line);
	unsigned rqpn, rpsn;
	char rhex[64];
	union ibv_gid rgid;

	if (sock_line(fd, line, sizeof(line)) ||
	    sscanf(line, "%x %x %63s", &rqpn, &rpsn, rhex) != 3 || strlen(rhex) != 32)
		die("peer's line: %s", line);
	for (int i = 0; i < 16; i++)
		sscanf(rhex + 2 * i, "%2hhx", &rgid.raw[i]);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.dgid = rgid;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 17;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				   IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
	uint64_t base = (uintptr_t)buf;
	struct ibv_wc wc = { .status = -1 };

	if (!host) {
		/* Server: the two windows, a receive for the invalidation. */
		struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);

		if (!mw1 || !mw2)
			die("ibv_alloc_mw");
		struct ibv_mw_bind b1 = {
			.wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = mr, .addr = base + 1024, .length = 1024,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};
		if (ibv_bind_mw(qp, mw1, &b1) || (wc = next_wc(cq)).status != IBV_WC_SUCCESS ||
		    wc.opcode != IBV_WC_BIND_MW)
			die("ibv_bind_mw (type 1)");
		uint32_t k2 = ibv_inc_rkey(mw2->rkey);
		struct ibv_send_wr bw = { .wr_id = 12, .opcode = IBV_WR_BIND_MW,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		bw.bind_mw.mw = mw2;
		bw.bind_mw.rkey = k2;
		bw.bind_mw.bind_info = (struct ibv_mw_bind_info){
			.mr = mr, .addr = base + 4096, .length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ };
		if (ibv_post_send(qp, &bw, &bad) || (wc = next_wc(cq)).status != IBV_WC_SUCCESS)
			die("IBV_WR_BIND_MW (type 2): status %d", wc.status);
		mw2->rkey = k2;
		for (int i = 4096; i < SIZE; i++)
			buf[i] = (char)(i * 7 + 3);
		struct ibv_sge rs = { .addr = base, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 13, .sg_list = &rs, .num_sge = 1 }, *rbad;

		if (ibv_post_recv(qp, &rw, &rbad))
			die("post_recv");
		snprintf(line, sizeof(line), "%08x %016llx %08x %016llx\n", mw1->rkey,
			 (unsigned long long)base + 1024, k2, (unsigned long long)base + 4096);
		sock_send(fd, line);
		if (sock_line(fd, line, sizeof(line)) || strcmp(line, "check"))
			die("client's check: %s", line);
		wc = next_wc(cq);
		/* RXE sets the kernel's IB_WC_WITH_INVALIDATE (4), which user
		 * space reads as IBV_WC_IP_CSUM_OK. */
		int flag = rxe ? 4 : IBV_WC_WITH_INV;
		char why[160] = "";

		if (wc.wr_id != 13 || wc.status != IBV_WC_SUCCESS || !(wc.wc_flags & flag) ||
		    wc.invalidated_rkey != k2)
			snprintf(why, sizeof(why),
				 "bad receive: wr %llu status %d flags %#x invalidated %#x (want %#x)\n",
				 (unsigned long long)wc.wr_id, wc.status, wc.wc_flags,
				 wc.invalidated_rkey, k2);
		for (int i = 1024; i < 2048 && !why[0]; i++)
			if (buf[i] != (char)(i * 13 + 5))
				snprintf(why, sizeof(why), "bad byte %d written through window 1\n", i);
		sock_send(fd, why[0] ? why : "ok\n");
		/* Hold the QP until the client's last READ is answered. */
		sock_line(fd, line, sizeof(line));
		if (why[0])
			die("%s", why);
		printf("mw-peer: ok server: type 1 window written, type 2 window read and "
		       "invalidated by the peer (%#x)\n", k2);
		ibv_destroy_qp(qp);
		ibv_dealloc_mw(mw1);
		ibv_dealloc_mw(mw2);
		return 0;
	}

	/* Client. */
	unsigned k1, k2;
	unsigned long long a1, a2;

	if (sock_line(fd, line, sizeof(line)) ||
	    sscanf(line, "%x %llx %x %llx", &k1, &a1, &k2, &a2) != 4)
		die("server's windows: %s", line);
	for (int i = 0; i < 1024; i++)
		buf[i] = (char)((i + 1024) * 13 + 5);
	struct ibv_sge s = { .addr = base, .length = 1024, .lkey = mr->lkey };
	int r = rdma(qp, cq, IBV_WR_RDMA_WRITE, &s, a1, k1);

	if (r != IBV_WC_SUCCESS)
		die("RDMA WRITE through the type 1 window: status %d", r);
	s.addr = base + 4096;
	s.length = 4096;
	r = rdma(qp, cq, IBV_WR_RDMA_READ, &s, a2, k2);
	if (r != IBV_WC_SUCCESS)
		die("RDMA READ through the type 2 window: status %d", r);
	for (int i = 4096; i < SIZE; i++)
		if (buf[i] != (char)(i * 7 + 3))
			die("byte %d read through the type 2 window", i);
	s.addr = base;
	s.length = 16;
	struct ibv_send_wr inv = { .wr_id = 3, .sg_list = &s, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV,
				   .send_flags = IBV_SEND_SIGNALED,
				   .invalidate_rkey = k2 }, *bad;

	if (ibv_post_send(qp, &inv, &bad) || (wc = next_wc(cq)).status != IBV_WC_SUCCESS)
		die("SEND WITH INVALIDATE: status %d", wc.status);
	sock_send(fd, "check\n");
	if (sock_line(fd, line, sizeof(line)) || strcmp(line, "ok"))
		die("server: %s", line);
	s.addr = base + 4096;
	s.length = 64;
	r = rdma(qp, cq, IBV_WR_RDMA_READ, &s, a2, k2);
	sock_send(fd, "done\n");
	if (r != IBV_WC_REM_ACCESS_ERR)
		die("READ through the invalidated rkey: status %d (want %d)", r,
		    IBV_WC_REM_ACCESS_ERR);
	printf("mw-peer: ok client: WRITE through a type 1 window, READ through a "
	       "type 2 window, SEND WITH INVALIDATE of it, then its rkey refused\n");
	ibv_destroy_qp(qp);
	return 0;
}
