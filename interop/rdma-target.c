/*
 * rdma-target: the passive side of burst's RDMA WRITE/READ interop test,
 * built against the system libibverbs and run on kernel RXE in the lab VM.
 *
 * It registers SIZE bytes (first half filled with (i*13+7) & 0xff, second
 * half zero), exchanges one text line each way over TCP:
 *   target -> client: "QPN PSN GID RKEY VADDR SIZE\n"   (hex GID, 32 digits)
 *   client -> target: "QPN PSN GID\n"
 * connects its RC QP, then waits for "check SEED\n": by then the client has
 * READ the first half and WRITTEN (i*31+SEED) & 0xff over the second half.
 * It verifies the second half and answers "ok\n" or "bad OFFSET\n".
 *
 * usage: rdma-target [-p PORT] [-s SIZE] [-g GID_INDEX] [-m MTU]
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *m) { perror(m); exit(1); }

int main(int argc, char **argv)
{
	int port = 18515, gidx = 1, opt;
	size_t size = 1 << 20;
	enum ibv_mtu mtu = IBV_MTU_1024;
	while ((opt = getopt(argc, argv, "p:s:g:m:")) != -1) {
		switch (opt) {
		case 'p': port = atoi(optarg); break;
		case 's': size = strtoul(optarg, NULL, 0); break;
		case 'g': gidx = atoi(optarg); break;
		case 'm': mtu = atoi(optarg) == 4096 ? IBV_MTU_4096 : IBV_MTU_1024; break;
		default: fprintf(stderr, "usage: %s [-p PORT] [-s SIZE] [-g GIDX] [-m MTU]\n", argv[0]); return 2;
		}
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0]) die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	unsigned char *buf = malloc(size);
	for (size_t i = 0; i < size; i++) buf[i] = i < size / 2 ? (unsigned char)(i * 13 + 7) : 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr) die("ibv_reg_mr");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp) die("ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) die("ibv_query_gid");
	srand(time(NULL) ^ getpid());
	unsigned psn = rand() & 0xffffff;

	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1)) die("listen");
	int s = accept(ls, NULL, NULL);
	if (s < 0) die("accept");
	FILE *in = fdopen(s, "r");
	char line[256], hex[33];
	for (int i = 0; i < 16; i++) sprintf(hex + 2 * i, "%02x", gid.raw[i]);
	int n = snprintf(line, sizeof line, "%06x %06x %s %08x %016llx %zx\n", qp->qp_num, psn, hex,
			 mr->rkey, (unsigned long long)(uintptr_t)buf, size);
	if (write(s, line, n) != n) die("write");
	unsigned rqpn, rpsn;
	char rgid[40];
	if (!fgets(line, sizeof line, in) || sscanf(line, "%x %x %32s", &rqpn, &rpsn, rgid) != 3) die("peer line");
	union ibv_gid dgid;
	for (int i = 0; i < 16; i++) sscanf(rgid + 2 * i, "%2hhx", &dgid.raw[i]);
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = rqpn, .rq_psn = rpsn,
		.max_dest_rd_atomic = 16, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = dgid, .sgid_index = gidx, .hop_limit = 64 } } };
	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("RTR");
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .sq_psn = psn, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &t, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)) die("RTS");
	printf("rdma-target: QPN 0x%06x rkey 0x%x vaddr %p size %zu, peer QPN 0x%06x\n", qp->qp_num, mr->rkey, (void *)buf, size, rqpn);
	fflush(stdout);
	unsigned seed;
	if (!fgets(line, sizeof line, in) || sscanf(line, "check %u", &seed) != 1) die("check line");
	size_t bad = 0;
	int ok = 1;
	for (size_t i = size / 2; i < size; i++)
		if (buf[i] != (unsigned char)(i * 31 + seed)) { ok = 0; bad = i; break; }
	n = ok ? snprintf(line, sizeof line, "ok\n") : snprintf(line, sizeof line, "bad %zu\n", bad);
	if (write(s, line, n) != n) die("write");
	printf("rdma-target: %s", line);
	close(s);
	return ok ? 0 : 1;
}
