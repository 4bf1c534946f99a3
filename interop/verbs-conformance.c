/*
 * Verbs semantics a provider owes its applications, checked in one process
 * with no peer: the extended queries, the context's command descriptor,
 * ibv_create_qp_ex's attributes, and which posts a QP's state and queue
 * depth allow. Built against the system libibverbs; run on burst's drop-in
 * (LD_LIBRARY_PATH) or on kernel RXE, whose behaviour it follows.
 *
 * The extended CQ (ibv_create_cq_ex, ibv_start_poll, ibv_wc_read_*) and
 * memory windows (types 1 and 2: bind, access through the window, local
 * and remote invalidation) and a CQ overrun (IBV_EVENT_CQ_ERR) are checked
 * over RC QPs of the device connected to each other through GID
 * `gid-index` (default 0).
 *
 * librdmacm's address rules come last: rdma_getaddrinfo with only a
 * destination in the hints, a passive lookup's flags, rdma_bind_addr on
 * loopback (a port, no device), and a synchronous id moved to a channel
 * (rdma_migrate_id) reporting its next event there (libfabric's verbs
 * provider depends on each).
 *
 * Usage: verbs-conformance [device-name [gid-index]]
 * (exit status: failed checks)
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <arpa/inet.h>

static int failed;

static void check(int ok, const char *what)
{
	printf("%s  %s\n", ok ? "ok  " : "FAIL", what);
	if (!ok)
		failed++;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &a);
}

static int to_state(struct ibv_qp *qp, enum ibv_qp_state s)
{
	struct ibv_qp_attr a = { .qp_state = s };
	int mask = IBV_QP_STATE;

	if (s == IBV_QPS_INIT) {
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	}
	return ibv_modify_qp(qp, &a, mask);
}

static int post_send(struct ibv_qp *qp, struct ibv_sge *sge, uint64_t id)
{
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(struct ibv_qp *qp, struct ibv_sge *sge, uint64_t id)
{
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

/* Polls up to `n` completions within about a second; returns how many
 * had status `want`. */
static int flushed(struct ibv_cq *cq, int n, enum ibv_wc_status want)
{
	struct ibv_wc wc;
	int got = 0, seen = 0;

	for (int i = 0; i < 100000 && seen < n; i++) {
		int k = ibv_poll_cq(cq, 1, &wc);

		if (k == 1) {
			seen++;
			got += wc.status == want;
		} else {
			usleep(10);
		}
	}
	return got;
}

/* INIT -> RTR (-> RTS) towards `dest` on this device, through GID `gidx`. */
static int connect_rc(struct ibv_qp *qp, uint32_t dest, int gidx, int rts)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				   IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.sgid_index = gidx;
	if (ibv_query_gid(qp->context, 1, gidx, &a.ah_attr.grh.dgid))
		return -1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	if (!rts)
		return 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
				      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* The extended CQ: a SEND with immediate between two connected QPs, both
 * completions read through ibv_start_poll / ibv_wc_read_*. The receiver
 * stays in RTR, as a passive side before the CM's RTU: its first packet
 * raises IBV_EVENT_COMM_EST on the context's (readable) async descriptor. */
static void cq_ex(struct ibv_context *ctx, struct ibv_pd *pd, int gidx)
{
	char msg[200];
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
			    IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
			    IBV_WC_EX_WITH_SL,
	};
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);

	check(cqx != NULL, "ibv_create_cq_ex with byte_len, imm, qp_num, src_qp, sl");
	if (!cqx)
		return;
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *a = rc_qp(pd, cq), *b = rc_qp(pd, cq);

	if (!mr || !a || !b || connect_rc(a, b->qp_num, gidx, 1) ||
	    connect_rc(b, a->qp_num, gidx, 0)) {
		check(0, "two RC QPs connected to each other");
		return;
	}
	/* ibv_rereg_mr of the access: the MR works with the keys it reports. */
	int rr = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	snprintf(msg, sizeof(msg), "ibv_rereg_mr of the access (got %d, %s)", rr,
		 rr ? strerror(errno) : "ok");
	if (rr && !strncmp(ibv_get_device_name(ctx->device), "rxe", 3))
		printf("skip  %s: RXE of this kernel has no rereg\n", msg);
	else
		check(rr == 0, msg);
	/* ibv_resize_cq: a larger depth is reported, 0 is refused. */
	check(!ibv_resize_cq(cq, 64) && cq->cqe >= 64, "ibv_resize_cq to 64");
	check(ibv_resize_cq(cq, 0) != 0, "ibv_resize_cq to 0 is refused");
	struct ibv_sge rs = { .addr = (uintptr_t)buf + 2048, .length = 1024,
			      .lkey = mr->lkey };
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = 100,
			      .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED,
				  .imm_data = htobe32(0x12345678) };
	struct ibv_send_wr *bad;

	check(!post_recv(b, &rs, 8) && !ibv_post_send(a, &wr, &bad),
	      "post a receive and a SEND with immediate");
	int sends = 0, recvs = 0, ok_send = 0, ok_recv = 0;
	struct ibv_poll_cq_attr pa = { 0 };

	for (int i = 0; i < 500000 && sends + recvs < 2; i++) {
		int r = ibv_start_poll(cqx, &pa);

		if (r == ENOENT) {
			usleep(10);
			continue;
		}
		while (r == 0) {
			if (cqx->wr_id == 7) {
				sends++;
				ok_send = cqx->status == IBV_WC_SUCCESS &&
					  ibv_wc_read_opcode(cqx) == IBV_WC_SEND &&
					  ibv_wc_read_qp_num(cqx) == a->qp_num;
			} else if (cqx->wr_id == 8) {
				recvs++;
				snprintf(msg, sizeof(msg),
					 "receive read with ibv_wc_read_*: status %d opcode %d "
					 "byte_len %u imm %#x qp %#x flags %#x",
					 cqx->status, ibv_wc_read_opcode(cqx),
					 ibv_wc_read_byte_len(cqx),
					 be32toh(ibv_wc_read_imm_data(cqx)),
					 ibv_wc_read_qp_num(cqx), ibv_wc_read_wc_flags(cqx));
				ok_recv = cqx->status == IBV_WC_SUCCESS &&
					  ibv_wc_read_opcode(cqx) == IBV_WC_RECV &&
					  ibv_wc_read_byte_len(cqx) == 100 &&
					  be32toh(ibv_wc_read_imm_data(cqx)) == 0x12345678 &&
					  (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM) &&
					  ibv_wc_read_qp_num(cqx) == b->qp_num;
			}
			r = ibv_next_poll(cqx);
		}
		ibv_end_poll(cqx);
	}
	check(sends == 1 && ok_send, "send completion read with ibv_start_poll");
	if (!recvs)
		snprintf(msg, sizeof(msg), "receive read with ibv_wc_read_*: none");
	check(recvs == 1 && ok_recv, msg);

	/* RNICs raise COMM_EST (IBA o11-5.1.1); kernel RXE does not. */
	if (!strncmp(ibv_get_device_name(ctx->device), "rxe", 3)) {
		printf("skip  COMM_EST (RXE raises none)\n");
		goto out;
	}
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int readable = poll(&pfd, 1, 2000) == 1;

	check(readable, "the async descriptor becomes readable");
	if (readable && !ibv_get_async_event(ctx, &ev)) {
		snprintf(msg, sizeof(msg), "async event %s on the receiver (want %s)",
			 ibv_event_type_str(ev.event_type),
			 ibv_event_type_str(IBV_EVENT_COMM_EST));
		check(ev.event_type == IBV_EVENT_COMM_EST && ev.element.qp == b, msg);
		ibv_ack_async_event(&ev);
	}
out:
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(mr);
	check(!ibv_destroy_cq(cq), "ibv_destroy_cq of an extended CQ");
}

/* The next completion of `cq` (about two seconds at most); status -1 if none. */
static struct ibv_wc next_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc = { .status = -1 };

	for (int i = 0; i < 200000; i++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1)
			return wc;
		usleep(10);
	}
	wc.status = -1;
	return wc;
}

/* An RC WRITE or READ of `len` bytes at `raddr` through `rkey`, from `qp`;
 * returns its completion status. */
static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
		struct ibv_sge *sge, uint64_t raddr, uint32_t rkey)
{
	struct ibv_send_wr wr = { .wr_id = 40, .sg_list = sge, .num_sge = 1,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		return -2;
	return next_wc(cq).status;
}

/* Two RC QPs connected to each other, `a` the requester, `b` the target. */
static int rc_pair(struct ibv_pd *pd, struct ibv_cq *cq, int gidx,
		   struct ibv_qp **a, struct ibv_qp **b)
{
	*a = rc_qp(pd, cq);
	*b = rc_qp(pd, cq);
	return !*a || !*b || connect_rc(*a, (*b)->qp_num, gidx, 1) ||
	       connect_rc(*b, (*a)->qp_num, gidx, 1);
}

/* A fresh pair after a remote access error broke the old one: its
 * completions drained, both QPs destroyed. */
static int renew_pair(struct ibv_pd *pd, struct ibv_cq *cq, int gidx,
		      struct ibv_qp **a, struct ibv_qp **b)
{
	struct ibv_wc wc;

	ibv_destroy_qp(*a);
	ibv_destroy_qp(*b);
	while (ibv_poll_cq(cq, 1, &wc) == 1)
		;
	return rc_pair(pd, cq, gidx, a, b);
}

/* An RC QP made by ibv_create_qp_ex with `send_ops` (checked, reported as
 * `what`) and a plain RC QP, connected to each other; 0 when they are. */
static int ext_pair(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq, int gidx,
		    uint64_t send_ops, const char *what, struct ibv_qp **x, struct ibv_qp **xp)
{
	char msg[160];
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = send_ops,
	};

	*x = ibv_create_qp_ex(ctx, &xa);
	snprintf(msg, sizeof(msg), "ibv_create_qp_ex with %s (%s)", what,
		 *x ? "created" : strerror(errno));
	check(*x != NULL, msg);
	*xp = *x ? rc_qp(pd, cq) : NULL;
	return !*x || !*xp || connect_rc(*x, (*xp)->qp_num, gidx, 1) ||
	       connect_rc(*xp, (*x)->qp_num, gidx, 1);
}

/* Memory windows (IBA 10.6.7, as RXE offers them). The target region has
 * no remote right of its own: whatever a peer reaches, it reaches through
 * a window. */
static void windows(struct ibv_context *ctx, struct ibv_pd *pd, int gidx)
{
	char msg[200];
	struct ibv_device_attr da;
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	static char buf[8192], local[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, sizeof(local), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *a, *b;
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	int rxe = !strncmp(ibv_get_device_name(ctx->device), "rxe", 3);

	int r = ibv_query_device(ctx, &da);
	snprintf(msg, sizeof(msg), "memory windows offered: max_mw %d, cap flags %#x",
		 r ? -1 : da.max_mw, r ? 0 : da.device_cap_flags);
	check(!r && da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW), msg);
	if (!cq || !mr || !lmr || rc_pair(pd, cq, gidx, &a, &b)) {
		check(0, "MW set-up: a CQ, regions with MW_BIND, two connected RC QPs");
		return;
	}
	uint64_t base = (uintptr_t)buf;
	struct ibv_sge ls = { .addr = (uintptr_t)local, .length = 16, .lkey = lmr->lkey };

	/* Type 1: ibv_bind_mw, then a WRITE inside the window lands. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	check(mw1 != NULL, "ibv_alloc_mw type 1");
	if (!mw1)
		goto out;
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind bind1 = {
		.wr_id = 31, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = base + 256, .length = 512,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
	};
	r = ibv_bind_mw(b, mw1, &bind1);
	wc = next_wc(cq);
	snprintf(msg, sizeof(msg),
		 "ibv_bind_mw: %d, completion status %d opcode %d, rkey %#x -> %#x", r,
		 wc.status, wc.opcode, before, mw1->rkey);
	check(!r && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW &&
		      wc.wr_id == 31 && mw1->rkey == ibv_inc_rkey(before), msg);
	memcpy(local, "through window 1", 16);
	r = rdma(a, cq, IBV_WR_RDMA_WRITE, &ls, base + 300, mw1->rkey);
	snprintf(msg, sizeof(msg), "RDMA WRITE through the type 1 window: status %d", r);
	check(r == IBV_WC_SUCCESS && !memcmp(buf + 300, "through window 1", 16), msg);
	r = rdma(a, cq, IBV_WR_RDMA_WRITE, &ls, base + 300, before);
	snprintf(msg, sizeof(msg), "the rkey before the bind misses: status %d", r);
	check(r == IBV_WC_REM_ACCESS_ERR, msg);
	if (renew_pair(pd, cq, gidx, &a, &b))
		goto out;
	r = rdma(a, cq, IBV_WR_RDMA_READ, &ls, base + 300, mw1->rkey);
	snprintf(msg, sizeof(msg), "a READ the window does not grant: status %d", r);
	check(r == IBV_WC_REM_ACCESS_ERR, msg);
	if (renew_pair(pd, cq, gidx, &a, &b))
		goto out;
	r = rdma(a, cq, IBV_WR_RDMA_WRITE, &ls, base + 100, mw1->rkey);
	snprintf(msg, sizeof(msg), "a WRITE before the window's start: status %d", r);
	if (rxe && r == IBV_WC_SUCCESS)
		printf("skip  %s: RXE of this kernel checks the region's bounds, "
		       "not the window's\n", msg);
	else
		check(r == IBV_WC_REM_ACCESS_ERR, msg);
	r = ibv_dereg_mr(mr);
	snprintf(msg, sizeof(msg), "ibv_dereg_mr of a region with a window bound fails (%d)", r);
	check(r != 0, msg);

	/* Type 2: bound by a work request, READ through it, then a SEND WITH
	 * INVALIDATE from the peer frees it and its rkey misses. */
	if (renew_pair(pd, cq, gidx, &a, &b))
		goto out;
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	check(mw2 != NULL, "ibv_alloc_mw type 2");
	if (!mw2)
		goto out;
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bw = { .wr_id = 32, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED };
	bw.bind_mw.mw = mw2;
	bw.bind_mw.rkey = k2;
	bw.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = mr, .addr = base + 4096, .length = 4096,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE };
	r = ibv_post_send(b, &bw, &bad);
	wc = next_wc(cq);
	snprintf(msg, sizeof(msg), "IBV_WR_BIND_MW of a type 2 window: %d, status %d opcode %d",
		 r, wc.status, wc.opcode);
	check(!r && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, msg);
	mw2->rkey = k2;
	memcpy(buf + 5000, "through window 2", 16);
	memset(local, 0, 16);
	r = rdma(a, cq, IBV_WR_RDMA_READ, &ls, base + 5000, k2);
	snprintf(msg, sizeof(msg), "RDMA READ through the type 2 window: status %d", r);
	check(r == IBV_WC_SUCCESS && !memcmp(local, "through window 2", 16), msg);
	struct ibv_sge rs = { .addr = (uintptr_t)local + 1024, .length = 64,
			      .lkey = lmr->lkey };
	struct ibv_send_wr inv = { .wr_id = 33, .sg_list = &ls, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV,
				   .send_flags = IBV_SEND_SIGNALED,
				   .invalidate_rkey = k2 };
	int recv_ok = 0, send_ok = 0;

	r = post_recv(b, &rs, 34) || ibv_post_send(a, &inv, &bad);
	for (int i = 0; i < 2 && !r; i++) {
		wc = next_wc(cq);
		if (wc.wr_id == 33)
			send_ok = wc.status == IBV_WC_SUCCESS;
		if (wc.wr_id == 34) {
			snprintf(msg, sizeof(msg),
				 "SEND WITH INVALIDATE of the window's rkey: status %d "
				 "flags %#x invalidated %#x (want %#x)",
				 wc.status, wc.wc_flags, wc.invalidated_rkey, k2);
			/* RXE sets the kernel's IB_WC_WITH_INVALIDATE (4),
			 * which user space reads as IBV_WC_IP_CSUM_OK. */
			recv_ok = wc.status == IBV_WC_SUCCESS &&
				  (wc.wc_flags & (rxe ? 4 : IBV_WC_WITH_INV)) &&
				  wc.invalidated_rkey == k2;
		}
	}
	if (!recv_ok && r)
		snprintf(msg, sizeof(msg), "SEND WITH INVALIDATE: post failed");
	check(!r && send_ok && recv_ok, msg);
	r = rdma(a, cq, IBV_WR_RDMA_READ, &ls, base + 5000, k2);
	snprintf(msg, sizeof(msg), "the invalidated window's rkey misses: status %d", r);
	check(r == IBV_WC_REM_ACCESS_ERR, msg);

	/* Bound again (free once more), then a local invalidate; a second
	 * one finds nothing bound and completes in error. */
	if (renew_pair(pd, cq, gidx, &a, &b))
		goto out;
	k2 = ibv_inc_rkey(k2);
	bw.bind_mw.rkey = k2;
	r = ibv_post_send(b, &bw, &bad);
	wc = next_wc(cq);
	check(!r && wc.status == IBV_WC_SUCCESS, "the freed type 2 window binds again");
	mw2->rkey = k2;
	/* (INLINE means nothing to a local operation: ignored, as RXE.) */
	struct ibv_send_wr li = { .wr_id = 35, .opcode = IBV_WR_LOCAL_INV,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
				  .invalidate_rkey = k2 };
	r = ibv_post_send(b, &li, &bad);
	wc = next_wc(cq);
	snprintf(msg, sizeof(msg), "IBV_WR_LOCAL_INV: %d, status %d opcode %d", r, wc.status,
		 wc.opcode);
	check(!r && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, msg);
	li.wr_id = 36;
	if (rxe) {
		/* rxe_do_invalidate_mw of a free window dereferences its NULL QP. */
		printf("skip  a second LOCAL_INV: it crashes the kernel of RXE 6.1\n");
	} else {
		r = ibv_post_send(b, &li, &bad);
		wc = next_wc(cq);
		snprintf(msg, sizeof(msg), "a second LOCAL_INV completes in error: status %d",
			 wc.status);
		check(!r && wc.wr_id == 36 && wc.status != IBV_WC_SUCCESS &&
			      wc.status != (enum ibv_wc_status)-1, msg);
	}
	while (ibv_poll_cq(cq, 1, &wc) == 1)
		;

	/* The extended QP API: a QP created with BIND_MW and LOCAL_INV in its
	 * send ops binds the (free again) type 2 window and invalidates it
	 * through ibv_wr_bind_mw / ibv_wr_local_inv. */
	struct ibv_qp *x, *xp;
	if (!ext_pair(ctx, pd, cq, gidx,
		      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_RDMA_WRITE,
		      "IBV_QP_EX_WITH_BIND_MW | LOCAL_INV", &x, &xp)) {
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(x);
		struct ibv_mw_bind_info bi = {
			.mr = mr, .addr = base + 4096, .length = 4096,
			.mw_access_flags = IBV_ACCESS_REMOTE_READ,
		};
		k2 = ibv_inc_rkey(k2);
		ibv_wr_start(qx);
		qx->wr_id = 37;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(qx, mw2, k2, &bi);
		r = ibv_wr_complete(qx);
		wc = next_wc(cq);
		snprintf(msg, sizeof(msg), "ibv_wr_bind_mw: %d, status %d opcode %d", r, wc.status,
			 wc.opcode);
		check(!r && wc.wr_id == 37 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_BIND_MW, msg);
		mw2->rkey = k2;
		ibv_wr_start(qx);
		qx->wr_id = 38;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(qx, k2);
		r = ibv_wr_complete(qx);
		wc = next_wc(cq);
		snprintf(msg, sizeof(msg), "ibv_wr_local_inv: %d, status %d opcode %d", r, wc.status,
			 wc.opcode);
		check(!r && wc.wr_id == 38 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_LOCAL_INV, msg);
	} else if (x) {
		check(0, "the extended QP connected");
	}
	if (xp)
		ibv_destroy_qp(xp);
	if (x)
		ibv_destroy_qp(x);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	while (ibv_poll_cq(cq, 1, &wc) == 1)
		;
	check(!ibv_dealloc_mw(mw2), "ibv_dealloc_mw type 2");
	check(!ibv_dealloc_mw(mw1), "ibv_dealloc_mw type 1");
	check(!ibv_dereg_mr(mr), "ibv_dereg_mr once the windows are gone");
	mr = NULL;
out:
	if (mr)
		ibv_dereg_mr(mr);
	ibv_dereg_mr(lmr);
	ibv_destroy_cq(cq);
}

/* ibv_attach_mcast / ibv_detach_mcast: a UD QP and a multicast GID only;
 * detaching what is not attached fails. (Traffic: interop/mcast-peer.c.) */
static void multicast(struct ibv_pd *pd, struct ibv_cq *cq)
{
	char msg[160];
	struct ibv_qp_init_attr a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *ud = ibv_create_qp(pd, &a), *rc = rc_qp(pd, cq);
	union ibv_gid group = { .raw = { [10] = 0xff, [11] = 0xff, 239, 255, 18, 2 } };
	union ibv_gid unicast = { .raw = { [10] = 0xff, [11] = 0xff, 198, 18, 0, 77 } };

	if (!ud || !rc) {
		check(0, "multicast: a UD and an RC QP");
		return;
	}
	int r = ibv_attach_mcast(rc, &group, 0);
	snprintf(msg, sizeof(msg), "ibv_attach_mcast of an RC QP: EINVAL (got %d)", r);
	check(r == EINVAL, msg);
	r = ibv_attach_mcast(ud, &unicast, 0);
	snprintf(msg, sizeof(msg), "ibv_attach_mcast to a unicast GID: EINVAL (got %d)", r);
	check(r == EINVAL, msg);
	r = ibv_attach_mcast(ud, &group, 0);
	snprintf(msg, sizeof(msg), "ibv_attach_mcast of a UD QP to 239.255.18.2 (got %d)", r);
	check(r == 0, msg);
	check(!ibv_detach_mcast(ud, &group, 0), "ibv_detach_mcast");
	r = ibv_detach_mcast(ud, &group, 0);
	snprintf(msg, sizeof(msg), "a second ibv_detach_mcast: EINVAL (got %d)", r);
	check(r == EINVAL, msg);
	ibv_destroy_qp(ud);
	ibv_destroy_qp(rc);
}

/* A CQ too small for its completions, nobody polling: the overrun raises
 * IBV_EVENT_CQ_ERR naming the CQ on the async descriptor (RXE raises it on
 * overflow). burst also keeps every completion (its own promise, checked
 * on burst only). Earlier checks' events still pending are skipped. */
static void cq_overrun(struct ibv_context *ctx, struct ibv_pd *pd, int gidx)
{
	static char buf[256];
	char msg[160];
	struct ibv_cq *small = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp *a, *b;
	const int n = 4;
	int r = 0, got = 0;

	if (!small || !mr || rc_pair(pd, small, gidx, &a, &b)) {
		check(0, "CQ overrun: set-up");
		return;
	}
	for (int i = 0; i < n && !r; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8,
				       .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 70 + i, .sg_list = &sge,
					  .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad;

		wr.wr.rdma.remote_addr = (uintptr_t)buf + 128;
		wr.wr.rdma.rkey = mr->rkey;
		r = ibv_post_send(a, &wr, &bad);
	}
	snprintf(msg, sizeof(msg),
		 "CQ overrun: %d signaled WRITEs to a QP whose CQ holds %d", n,
		 small->cqe);
	check(!r, msg);
	struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
	for (int t = 0; t < 50 && !got && poll(&pfd, 1, 100) >= 0; t++) {
		struct ibv_async_event ev;

		if (!(pfd.revents & POLLIN))
			continue;
		if (ibv_get_async_event(ctx, &ev))
			break;
		got = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
		ibv_ack_async_event(&ev);
	}
	snprintf(msg, sizeof(msg), "the overrun raises %s naming the CQ",
		 ibv_event_type_str(IBV_EVENT_CQ_ERR));
	check(got, msg);
	if (!strncmp(ibv_get_device_name(ctx->device), "burst", 5)) {
		int k = 0;

		for (; k < n; k++) {
			struct ibv_wc wc = next_wc(small);

			if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)(70 + k))
				break;
		}
		check(k == n, "no completion lost through the overrun, in order");
	} else {
		printf("skip  completions kept through the overrun (burst's own promise)\n");
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(small);
	ibv_dereg_mr(mr);
}

/* ECE (ibv_query_ece/ibv_set_ece): a provider without it (RXE) says
 * EOPNOTSUPP; one with it reports its vendor, refuses another vendor's
 * options, and keeps what both offer. A vendor ID of 0 is refused by
 * libibverbs itself. */
static void ece(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp *qp = rc_qp(pd, cq);
	struct ibv_ece e = { 0 }, none = { 0 }, foreign = { .vendor_id = 0x15b3, .options = 1 };
	char msg[160];

	if (!qp) {
		check(0, "ece: a QP");
		return;
	}
	int r = ibv_query_ece(qp, &e);
	snprintf(msg, sizeof(msg), "ibv_query_ece: 0 or EOPNOTSUPP (got %d, vendor 0x%x)", r,
		 e.vendor_id);
	check(r == 0 || r == EOPNOTSUPP, msg);
	check(ibv_set_ece(qp, &none) == EOPNOTSUPP, "ibv_set_ece with vendor ID 0: EOPNOTSUPP");
	if (r == 0) {
		check(e.vendor_id != 0 && e.comp_mask == 0, "ibv_query_ece: a vendor ID");
		check(ibv_set_ece(qp, &foreign) != 0, "ibv_set_ece refuses another vendor's options");
		struct ibv_ece mine = e;
		check(ibv_set_ece(qp, &mine) == 0, "ibv_set_ece takes its own vendor's options");
		struct ibv_ece after = { 0 };
		check(ibv_query_ece(qp, &after) == 0 && after.vendor_id == e.vendor_id &&
			      (after.options & ~e.options) == 0,
		      "ibv_query_ece after ibv_set_ece: the agreed options, a subset of the offer");
		check(!to_state(qp, IBV_QPS_INIT), "ECE set: RESET -> INIT still works");
	}
	ibv_destroy_qp(qp);
}

static void rdmacm_rules(void)
{
	char msg[200];
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
	inet_pton(AF_INET, "198.18.0.3", &dst.sin_addr);
	struct rdma_addrinfo h = {
		.ai_flags = RAI_FAMILY, .ai_family = AF_INET,
		.ai_qp_type = IBV_QPT_RC, .ai_port_space = RDMA_PS_TCP,
		.ai_dst_addr = (struct sockaddr *)&dst, .ai_dst_len = sizeof(dst),
	}, *res = NULL;
	int r = rdma_getaddrinfo(NULL, NULL, &h, &res);
	snprintf(msg, sizeof(msg),
		 "rdma_getaddrinfo(NULL, NULL, hints with a destination): %d, flags %d, dst_len %d",
		 r, res ? res->ai_flags : -1, res ? (int)res->ai_dst_len : -1);
	check(!r && res && res->ai_flags == RAI_FAMILY && res->ai_dst_len == sizeof(dst) &&
		      !memcmp(res->ai_dst_addr, &dst, sizeof(dst)) && !res->ai_src_len,
	      msg);
	if (!r)
		rdma_freeaddrinfo(res);
	struct rdma_addrinfo ph = {
		.ai_flags = RAI_PASSIVE | RAI_FAMILY, .ai_family = AF_INET,
		.ai_qp_type = IBV_QPT_RC, .ai_port_space = RDMA_PS_TCP,
	};
	res = NULL;
	r = rdma_getaddrinfo("127.0.0.1", NULL, &ph, &res);
	snprintf(msg, sizeof(msg), "rdma_getaddrinfo(127.0.0.1, passive): %d, flags %d (RAI_PASSIVE)",
		 r, res ? res->ai_flags : -1);
	check(!r && res && res->ai_flags == RAI_PASSIVE && res->ai_src_len == sizeof(dst) &&
		      !res->ai_dst_len,
	      msg);
	if (!r)
		rdma_freeaddrinfo(res);

	struct rdma_cm_id *id;
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
		check(0, "rdma_create_id without a channel");
		return;
	}
	struct sockaddr_in lo = { .sin_family = AF_INET };
	inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
	r = rdma_bind_addr(id, (struct sockaddr *)&lo);
	struct sockaddr_in *l = (struct sockaddr_in *)rdma_get_local_addr(id);
	snprintf(msg, sizeof(msg), "rdma_bind_addr(127.0.0.1): %d, a port (%u), no device yet (%p)",
		 r, ntohs(l->sin_port), (void *)id->verbs);
	check(!r && !id->verbs && l->sin_port != 0 && l->sin_addr.s_addr == lo.sin_addr.s_addr, msg);
	rdma_destroy_id(id);

	/* Created synchronous, moved to a channel: asynchronous from then on. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
		check(0, "an event channel and an id");
		return;
	}
	r = rdma_migrate_id(id, ch);
	check(!r && id->channel == ch, "rdma_migrate_id of a synchronous id to a channel");
	struct sockaddr_in to = lo;
	to.sin_port = htons(7471);
	r = rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int ready = !r && poll(&p, 1, 5000) == 1;
	struct rdma_cm_event *ev = NULL;
	int got = ready && !rdma_get_cm_event(ch, &ev);
	snprintf(msg, sizeof(msg),
		 "after the move, rdma_resolve_addr's event arrives on the channel (%s)",
		 got ? rdma_event_str(ev->event) : "none");
	check(got && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == id, msg);
	if (got)
		rdma_ack_cm_event(ev);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);

	/* librdmacm's ECE calls on an id with no QP (checked by the library
	 * alone, so the same on every provider). */
	if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
		check(0, "an id for the ECE calls");
		return;
	}
	struct { const char *what; struct ibv_ece ece; } bad[] = {
		{ "vendor 0", { .vendor_id = 0, .options = 1 } },
		{ "comp_mask 1", { .vendor_id = 0x02c9, .comp_mask = 1 } },
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errno = 0;
		r = rdma_set_local_ece(id, &bad[i].ece);
		snprintf(msg, sizeof(msg), "rdma_set_local_ece(%s): %d errno %d (EINVAL)",
			 bad[i].what, r, errno);
		check(r == -1 && errno == EINVAL, msg);
	}
	struct ibv_ece ece = { .vendor_id = 0x02c9 };
	r = rdma_set_local_ece(id, &ece);
	check(r == 0, "rdma_set_local_ece(vendor 0x02c9) on an id without a QP");
	struct ibv_ece remote = { .vendor_id = 7, .options = 7, .comp_mask = 7 };
	r = rdma_get_remote_ece(id, &remote);
	snprintf(msg, sizeof(msg),
		 "rdma_get_remote_ece before any REQ or REP: %d, vendor %u options %u mask %u (all 0)",
		 r, remote.vendor_id, remote.options, remote.comp_mask);
	check(!r && !remote.vendor_id && !remote.options && !remote.comp_mask, msg);
	rdma_destroy_id(id);
}

/* ibv_reg_mr of `addr` with `access` fails with EFAULT, as RXE's pinning. */
static void reg_refused(struct ibv_pd *pd, void *addr, size_t len, int access, const char *what)
{
	char msg[200];

	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	snprintf(msg, sizeof(msg), "ibv_reg_mr of %s fails with EFAULT (%s)", what,
		 mr ? "taken" : strerror(errno));
	check(!mr && errno == EFAULT, msg);
	if (mr)
		ibv_dereg_mr(mr);
}

/* ibv_reg_mr of `addr` with `access` is taken. */
static void reg_taken(struct ibv_pd *pd, void *addr, size_t len, int access, const char *what)
{
	char msg[200];
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);

	snprintf(msg, sizeof(msg), "ibv_reg_mr of %s", what);
	check(mr != NULL, msg);
	if (mr)
		ibv_dereg_mr(mr);
}

/* ibv_reg_mr faults the range in, as RXE's registration pins it: memory
 * that is not mapped, or mapped read-only where the access lets
 * the device write (window binds included, as the kernel's
 * ib_access_writable), is refused with EFAULT; a read-only page registered for
 * reading, and a fresh anonymous page registered for writing, are taken
 * (the fresh one is resident afterwards: no page fault on the data path). */
static void registration(struct ibv_pd *pd)
{
	char msg[200];
	long pg = sysconf(_SC_PAGESIZE);
	char *ro = mmap(NULL, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *wo = mmap(NULL, pg, PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* A low page no allocator hands out: one this test unmapped itself
	 * could be taken again by the library's threads. */
	char *gone = (char *)0x10000;
	unsigned char in_core;
	char *fresh = mmap(NULL, 64 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			   -1, 0);

	if (ro == MAP_FAILED || wo == MAP_FAILED || fresh == MAP_FAILED ||
	    mincore(gone, pg, &in_core) == 0 || errno != ENOMEM) {
		check(0, "mmap for the registration checks");
		return;
	}
	reg_refused(pd, gone, pg, IBV_ACCESS_LOCAL_WRITE, "unmapped memory");
	reg_refused(pd, ro, pg, IBV_ACCESS_LOCAL_WRITE, "a read-only page for local write");
	/* The kernel pins for writing when a window may grant writes. */
	reg_refused(pd, ro, pg, IBV_ACCESS_MW_BIND, "a read-only page for window binds");
	/* Writable but not readable in the kernel's view: pinned for reading
	 * with FOLL_FORCE. (PROT_NONE is too, on RXE; burst refuses it, as its
	 * engine reads through the process's mapping: docs/conformance.md.) */
	reg_taken(pd, wo, pg, 0, "a write-only page for reading");
	reg_taken(pd, ro, pg, 0, "a read-only page for reading");
	struct ibv_mr *mr =
		ibv_reg_mr(pd, fresh, 64 * pg, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	unsigned char vec[64];
	int resident = 0;
	if (mr && !mincore(fresh, 64 * pg, vec))
		for (int i = 0; i < 64; i++)
			resident += vec[i] & 1;
	snprintf(msg, sizeof(msg),
		 "ibv_reg_mr of 64 fresh pages for writing: all resident after (%d)", resident);
	check(mr && resident == 64, msg);
	if (mr)
		ibv_dereg_mr(mr);
	munmap(ro, pg);
	munmap(wo, pg);
	munmap(fresh, 64 * pg);
}

/* RDMA ATOMIC WRITE (IBA 1.5, RXE since Linux 6.2), where the device
 * advertises it in device_cap_flags_ex (the lab's 6.1 RXE does not; burst
 * does, and rdma-core's suite checks it there too): posted through
 * ibv_wr_atomic_write, its 8 bytes land as one store and complete as
 * IBV_WC_ATOMIC_WRITE; a region without REMOTE_WRITE (REMOTE_ATOMIC is not
 * enough) is a remote access error. */
static void atomic_write(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
			 int gidx)
{
	static uint64_t target[2] __attribute__((aligned(8)));
	char msg[160];
	struct ibv_device_attr_ex ax;
	struct ibv_wc wc;

	memset(&ax, 0, sizeof(ax));
	int r = ibv_query_device_ex(ctx, NULL, &ax);
	/* IB_UVERBS_DEVICE_ATOMIC_WRITE */
	if (r || !(ax.device_cap_flags_ex & (1ULL << 40))) {
		printf("skip  RDMA ATOMIC WRITE: not in device_cap_flags_ex\n");
		return;
	}
	struct ibv_mr *mr = ibv_reg_mr(pd, target, sizeof(target),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *no = ibv_reg_mr(pd, target, sizeof(target),
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_qp *x = NULL, *xp = NULL;
	if (mr && no &&
	    !ext_pair(ctx, pd, cq, gidx, IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE,
		      "IBV_QP_EX_WITH_ATOMIC_WRITE", &x, &xp)) {
		struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(x);
		uint64_t value = 0x0123456789abcdefULL;

		ibv_wr_start(qx);
		qx->wr_id = 41;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qx, mr->rkey, (uintptr_t)&target[1], &value);
		value = 0; /* captured at the call, as RXE's provider does */
		r = ibv_wr_complete(qx);
		wc = next_wc(cq);
		snprintf(msg, sizeof(msg),
			 "ibv_wr_atomic_write: %d, status %d opcode %d, stored %#llx", r,
			 wc.status, wc.opcode, (unsigned long long)target[1]);
		check(!r && wc.wr_id == 41 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_ATOMIC_WRITE &&
			      target[1] == 0x0123456789abcdefULL && target[0] == 0,
		      msg);
		value = 5;
		ibv_wr_start(qx);
		qx->wr_id = 42;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qx, no->rkey, (uintptr_t)&target[0], &value);
		r = ibv_wr_complete(qx);
		wc = next_wc(cq);
		snprintf(msg, sizeof(msg),
			 "ibv_wr_atomic_write without REMOTE_WRITE: status %d (REM_ACCESS_ERR %d)",
			 wc.status, IBV_WC_REM_ACCESS_ERR);
		check(!r && wc.wr_id == 42 && wc.status == IBV_WC_REM_ACCESS_ERR &&
			      target[0] == 0, msg);
	} else if (x) {
		check(0, "the atomic-write QP connected");
	}
	if (xp)
		ibv_destroy_qp(xp);
	if (x)
		ibv_destroy_qp(x);
	while (ibv_poll_cq(cq, 1, &wc) == 1)
		;
	if (no)
		ibv_dereg_mr(no);
	if (mr)
		ibv_dereg_mr(mr);
}

int main(int argc, char **argv)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	char msg[160];

	for (int i = 0; list && list[i]; i++)
		if (argc < 2 || !strcmp(ibv_get_device_name(list[i]), argv[1]))
			dev = dev ? dev : list[i];
	if (!dev) {
		fprintf(stderr, "no RDMA device%s%s\n", argc > 1 ? " named " : "",
			argc > 1 ? argv[1] : "");
		return 100;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx) {
		perror("ibv_open_device");
		return 100;
	}

	/* Extended device query: the port count is there too. */
	struct ibv_device_attr_ex ax;
	memset(&ax, 0xa5, sizeof(ax));
	int r = ibv_query_device_ex(ctx, NULL, &ax);
	snprintf(msg, sizeof(msg),
		 "ibv_query_device_ex: phys_port_cnt_ex %u = phys_port_cnt %u",
		 r ? 0 : ax.phys_port_cnt_ex, r ? 0 : ax.orig_attr.phys_port_cnt);
	check(!r && ax.phys_port_cnt_ex == ax.orig_attr.phys_port_cnt &&
		      ax.phys_port_cnt_ex >= 1, msg);

	/* The command descriptor is a descriptor. */
	int d = dup(ctx->cmd_fd);
	check(d >= 0, "ibv_context.cmd_fd can be dup'ed");
	if (d >= 0)
		close(d);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cq) {
		perror("pd/cq");
		return 100;
	}

	registration(pd);

	/* ibv_create_qp_ex: CREATE_FLAGS with no flag is fine, a flag is not;
	 * send ops are checked per QP type. */
	struct ibv_qp_init_attr_ex ex = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.pd = pd,
	};
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &ex);
	check(q != NULL, "ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS 0");
	if (q)
		ibv_destroy_qp(q);
	ex.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	q = ibv_create_qp_ex(ctx, &ex);
	check(q == NULL, "ibv_create_qp_ex refuses a create flag it lacks");
	if (q)
		ibv_destroy_qp(q);
	ex.create_flags = 0;
	ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
			    IBV_QP_EX_WITH_RDMA_READ;
	q = ibv_create_qp_ex(ctx, &ex);
	check(q != NULL && ibv_qp_to_qp_ex(q) != NULL,
	      "ibv_create_qp_ex RC with SEND, SEND_WITH_INV, RDMA_READ");
	if (q)
		ibv_destroy_qp(q);
	ex.qp_type = IBV_QPT_UD;
	ex.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	q = ibv_create_qp_ex(ctx, &ex);
	check(q == NULL, "ibv_create_qp_ex refuses RDMA WRITE on UD");
	if (q)
		ibv_destroy_qp(q);

	/* Posts and the QP's state and depth. */
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp *qp = rc_qp(pd, cq);
	if (!mr || !qp) {
		perror("mr/qp");
		return 100;
	}
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi);
	unsigned depth = qi.cap.max_recv_wr;

	check(post_send(qp, &sge, 1) != 0, "post_send in RESET fails");
	check(post_recv(qp, &sge, 2) != 0, "post_recv in RESET fails");
	check(!to_state(qp, IBV_QPS_INIT), "RESET -> INIT");
	r = 0;
	for (unsigned i = 0; i < depth && !r; i++)
		r = post_recv(qp, &sge, 10 + i);
	snprintf(msg, sizeof(msg), "post_recv in INIT: %u receives (the depth)", depth);
	check(!r, msg);
	r = post_recv(qp, &sge, 99);
	snprintf(msg, sizeof(msg), "post_recv beyond the depth: ENOMEM (got %d)", r);
	check(r == ENOMEM, msg);
	check(post_send(qp, &sge, 3) != 0, "post_send in INIT fails");
	check(!to_state(qp, IBV_QPS_ERR), "INIT -> ERR");
	/* The flushes land in the CQ; it cannot shrink below them. */
	usleep(200 * 1000);
	r = ibv_resize_cq(cq, 1);
	snprintf(msg, sizeof(msg),
		 "ibv_resize_cq below the completions it holds: EINVAL (got %d)", r);
	check(r == EINVAL, msg);
	snprintf(msg, sizeof(msg), "the %u receives are flushed", depth);
	check(flushed(cq, depth, IBV_WC_WR_FLUSH_ERR) == (int)depth, msg);
	check(!post_recv(qp, &sge, 4), "post_recv in ERR is taken");
	check(!post_send(qp, &sge, 5), "post_send in ERR is taken");
	check(flushed(cq, 2, IBV_WC_WR_FLUSH_ERR) == 2, "and both are flushed");
	check(!to_state(qp, IBV_QPS_RESET), "ERR -> RESET");
	check(post_recv(qp, &sge, 6) != 0, "post_recv in RESET fails again");

	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	multicast(pd, cq);
	ece(pd, cq);
	cq_ex(ctx, pd, argc > 2 ? atoi(argv[2]) : 0);
	windows(ctx, pd, argc > 2 ? atoi(argv[2]) : 0);
	atomic_write(ctx, pd, cq, argc > 2 ? atoi(argv[2]) : 0);
	cq_overrun(ctx, pd, argc > 2 ? atoi(argv[2]) : 0);
	rdmacm_rules();
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("verbs-conformance: %d failed\n", failed);
	return failed;
}
