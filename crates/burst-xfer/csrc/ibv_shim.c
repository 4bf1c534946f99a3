/*
 * burst-xfer's reach into the system's libibverbs: ibv_post_send,
 * ibv_post_recv and ibv_poll_cq are static inline functions of
 * <infiniband/verbs.h> (calls through the provider's ops table), so Rust
 * cannot call them by name; this file gives the few verbs a session needs
 * a narrow C interface with plain arguments, compiled against the
 * system's header. Every function returns 0 or a positive errno.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

struct xfer_ibv {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t port;
	int gid_index;
	enum ibv_mtu active_mtu;
};

/* Opens device `name` (NULL or "": the first) and allocates a PD. */
int xfer_ibv_open(const char *name, int gid_index, uint8_t gid[16],
		  struct xfer_ibv **out)
{
	struct ibv_device **list;
	struct ibv_port_attr port;
	union ibv_gid g;
	struct xfer_ibv *d;
	int i, n = 0, err = ENODEV;

	list = ibv_get_device_list(&n);
	if (!list)
		return errno ? errno : ENODEV;
	d = calloc(1, sizeof(*d));
	if (!d) {
		ibv_free_device_list(list);
		return ENOMEM;
	}
	for (i = 0; i < n; i++) {
		if (name && *name && strcmp(ibv_get_device_name(list[i]), name))
			continue;
		d->ctx = ibv_open_device(list[i]);
		break;
	}
	ibv_free_device_list(list);
	if (!d->ctx) {
		free(d);
		return err;
	}
	d->port = 1;
	d->gid_index = gid_index;
	if (ibv_query_port(d->ctx, d->port, &port) ||
	    ibv_query_gid(d->ctx, d->port, gid_index, &g)) {
		ibv_close_device(d->ctx);
		free(d);
		return EINVAL;
	}
	d->active_mtu = port.active_mtu;
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		ibv_close_device(d->ctx);
		free(d);
		return ENOMEM;
	}
	memcpy(gid, g.raw, 16);
	*out = d;
	return 0;
}

/* Frees the PD and closes the device (everything made on it destroyed). */
void xfer_ibv_close(struct xfer_ibv *d)
{
	ibv_dealloc_pd(d->pd);
	ibv_close_device(d->ctx);
	free(d);
}

int xfer_ibv_reg(struct xfer_ibv *d, void *addr, size_t len,
		 struct ibv_mr **mr, uint32_t *lkey, uint32_t *rkey)
{
	*mr = ibv_reg_mr(d->pd, addr, len,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				 IBV_ACCESS_REMOTE_READ);
	if (!*mr)
		return errno ? errno : ENOMEM;
	*lkey = (*mr)->lkey;
	*rkey = (*mr)->rkey;
	return 0;
}

int xfer_ibv_dereg(struct ibv_mr *mr)
{
	return ibv_dereg_mr(mr);
}

int xfer_ibv_cq(struct xfer_ibv *d, int entries, struct ibv_cq **out)
{
	*out = ibv_create_cq(d->ctx, entries, NULL, NULL, 0);
	return *out ? 0 : (errno ? errno : ENOMEM);
}

int xfer_ibv_destroy_cq(struct ibv_cq *cq)
{
	return ibv_destroy_cq(cq);
}

int xfer_ibv_qp(struct xfer_ibv *d, struct ibv_cq *scq, struct ibv_cq *rcq,
		uint32_t max_send, uint32_t max_recv, uint32_t max_inline,
		struct ibv_qp **out, uint32_t *qpn)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = max_inline;
	*out = ibv_create_qp(d->pd, &a);
	if (!*out)
		return errno ? errno : ENOMEM;
	*qpn = (*out)->qp_num;
	return 0;
}

int xfer_ibv_destroy_qp(struct ibv_qp *qp)
{
	return ibv_destroy_qp(qp);
}

/* INIT -> RTR -> RTS towards (gid, dqpn); mtu: IBV_MTU_* (capped at the
 * port's active MTU). */
int xfer_ibv_connect(struct xfer_ibv *d, struct ibv_qp *qp,
		     const uint8_t gid[16], uint32_t dqpn, uint32_t rq_psn,
		     uint32_t sq_psn, int mtu, uint8_t timeout,
		     uint8_t retry_cnt, uint8_t rd_atomic)
{
	struct ibv_qp_attr a;
	int err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = d->port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ;
	err = ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				    IBV_QP_ACCESS_FLAGS);
	if (err)
		return err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu < (int)d->active_mtu ? (enum ibv_mtu)mtu : d->active_mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
	a.ah_attr.grh.sgid_index = d->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = d->port;
	err = ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC |
				    IBV_QP_MIN_RNR_TIMER);
	if (err)
		return err;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = 7;
	a.max_rd_atomic = rd_atomic;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
				     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* op: 0 RDMA WRITE, 1 RDMA READ, 2 SEND of `len` bytes at `laddr` inline. */
int xfer_ibv_post(struct ibv_qp *qp, uint64_t wr_id, int op, uint64_t laddr,
		  uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		  int signaled)
{
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	switch (op) {
	case 0:
		wr.opcode = IBV_WR_RDMA_WRITE;
		break;
	case 1:
		wr.opcode = IBV_WR_RDMA_READ;
		break;
	case 2:
		wr.opcode = IBV_WR_SEND;
		wr.send_flags |= IBV_SEND_INLINE;
		break;
	default:
		return EINVAL;
	}
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

int xfer_ibv_post_recv(struct ibv_qp *qp, uint64_t wr_id, uint64_t addr,
		       uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad = NULL;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

/* 1: a completion (its wr_id, QP number and ibv_wc_status); 0: none;
 * -1: the CQ failed. */
int xfer_ibv_poll(struct ibv_cq *cq, uint64_t *wr_id, uint32_t *qpn,
		  int *status)
{
	struct ibv_wc wc;
	int n = ibv_poll_cq(cq, 1, &wc);

	if (n <= 0)
		return n < 0 ? -1 : 0;
	*wr_id = wc.wr_id;
	*qpn = wc.qp_num;
	*status = wc.status;
	return 1;
}

const char *xfer_ibv_status_str(int status)
{
	return ibv_wc_status_str((enum ibv_wc_status)status);
}
