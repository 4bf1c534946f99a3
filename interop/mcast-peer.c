/*
 * mcast-peer: UD multicast between two hosts, built against the system
 * libibverbs; run on burst's drop-in or on kernel RXE, either side.
 *
 * The server (receiver) attaches a UD QP to multicast group 239.255.18.1
 * (GID ::ffff:239.255.18.1, ibv_attach_mcast) and hands out its Q_Key; the
 * client (sender) sends COUNT messages to the group (QPN 0xFFFFFF, an
 * address handle on the group's GID). The receiver checks every message:
 * its bytes, the sender's QPN, and the group as the destination in the
 * GRH area; then detaches (a second detach must fail) and answers.
 *
 * One text line each way over TCP: server -> client "QKEY\n", client ->
 * server "sent QPN\n", server -> client "ok\n" or "bad WHY\n".
 *
 * usage: mcast-peer [-d DEVICE] [-g GID_INDEX] [-p PORT] [SERVER_HOST]
 * Prints "mcast-peer: ok ..." and exits 0 when every check passed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define COUNT 8
#define LEN 256
#define QKEY 0x11110000u
#define GROUP "239.255.18.1"
#define PEER "mcast-peer"
#include "peer.h"

int main(int argc, char **argv)
{
	const char *devname = NULL;
	int gidx = 0, port = 18700, opt;

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
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 2 * COUNT, NULL, NULL, 0) : NULL;
	static char buf[COUNT][LEN + 40];
	struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr qi = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = COUNT, .max_recv_wr = COUNT, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &qi) : NULL;

	if (!qp)
		die("set-up (context, PD, CQ, MR, UD QP)");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("RTS");
	union ibv_gid mgid = { 0 };
	struct in_addr group;

	inet_pton(AF_INET, GROUP, &group);
	mgid.raw[10] = mgid.raw[11] = 0xff;
	memcpy(&mgid.raw[12], &group, 4);
	char line[256];
	struct ibv_wc wc;

	if (!host) {
		/* Receiver. */
		for (int i = 0; i < COUNT; i++) {
			struct ibv_sge s = { .addr = (uintptr_t)buf[i], .length = LEN + 40,
					     .lkey = mr->lkey };
			struct ibv_recv_wr rw = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *bad;

			if (ibv_post_recv(qp, &rw, &bad))
				die("post_recv");
		}
		int r = ibv_attach_mcast(qp, &mgid, 0);

		if (r)
			die("ibv_attach_mcast: %s", strerror(r));
		/* RXE of kernel 6.1 adds only a MAC filter (an IPv6 one) when
		 * attached: the host's IP layer drops the group's datagrams
		 * unless it is a member. A socket joins for it. */
		int ipjoin = -1;

		if (!strncmp(ibv_get_device_name(dev), "rxe", 3)) {
			struct ip_mreq m = { .imr_multiaddr = group };
			union ibv_gid me;

			/* On the interface of our address (there may be no route
			 * for the group to pick one). */
			if (!ibv_query_gid(ctx, 1, gidx, &me))
				memcpy(&m.imr_interface, &me.raw[12], 4);
			ipjoin = socket(AF_INET, SOCK_DGRAM, 0);
			if (setsockopt(ipjoin, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m)))
				perror("IP_ADD_MEMBERSHIP (RXE 6.1 work-around)");
		}
		int fd = tcp(NULL, port);

		snprintf(line, sizeof(line), "%08x\n", QKEY);
		sock_send(fd, line);
		unsigned src;

		if (sock_line(fd, line, sizeof(line)) || sscanf(line, "sent %x", &src) != 1)
			die("sender's line: %s", line);
		char why[200] = "";
		int got = 0;

		for (int t = 0; t < 100000 && got < COUNT && !why[0]; t++) {
			if (ibv_poll_cq(cq, 1, &wc) != 1) {
				usleep(100);
				continue;
			}
			got++;
			char *m = buf[wc.wr_id] + 40;
			/* IPv4 RoCE v2: the IP header fills the GRH area's last 20
			 * bytes; its destination address is the group. */
			char *ip = buf[wc.wr_id] + 20;

			if (wc.status != IBV_WC_SUCCESS || wc.byte_len != LEN + 40 ||
			    wc.src_qp != src || !(wc.wc_flags & IBV_WC_GRH))
				snprintf(why, sizeof(why),
					 "receive %d: status %d byte_len %u src_qp %#x (want %#x) "
					 "flags %#x", got, wc.status, wc.byte_len, wc.src_qp, src,
					 wc.wc_flags);
			else if (memcmp(ip + 16, &group, 4))
				snprintf(why, sizeof(why), "receive %d: GRH destination is not "
					 "the group", got);
			for (int k = 0; k < LEN && !why[0]; k++)
				if (m[k] != (char)(k * 7 + m[0]))
					snprintf(why, sizeof(why), "receive %d: byte %d", got, k);
		}
		if (!why[0] && got < COUNT)
			snprintf(why, sizeof(why), "%d of %d messages arrived", got, COUNT);
		if (!why[0] && ibv_detach_mcast(qp, &mgid, 0))
			snprintf(why, sizeof(why), "ibv_detach_mcast failed");
		if (!why[0] && !ibv_detach_mcast(qp, &mgid, 0))
			snprintf(why, sizeof(why), "a second ibv_detach_mcast succeeded");
		snprintf(line, sizeof(line), "%s%s\n", why[0] ? "bad " : "ok", why);
		sock_send(fd, line);
		if (ipjoin >= 0)
			close(ipjoin);
		if (why[0])
			die("%s", why);
		printf("mcast-peer: ok receiver: %d messages from QP %#x through group %s, "
		       "detached\n", got, src, GROUP);
		return 0;
	}

	/* Sender. */
	int fd = tcp(host, port);
	unsigned qkey;

	if (sock_line(fd, line, sizeof(line)) || sscanf(line, "%x", &qkey) != 1)
		die("receiver's line: %s", line);
	struct ibv_ah_attr ah = { .is_global = 1, .port_num = 1 };

	ah.grh.dgid = mgid;
	ah.grh.sgid_index = gidx;
	ah.grh.hop_limit = 1;
	struct ibv_ah *h = ibv_create_ah(pd, &ah);

	if (!h)
		die("ibv_create_ah on the group's GID");
	for (int i = 0; i < COUNT; i++) {
		for (int k = 0; k < LEN; k++)
			buf[i][k] = (char)(k * 7 + i);
		struct ibv_sge s = { .addr = (uintptr_t)buf[i], .length = LEN, .lkey = mr->lkey };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;

		w.wr.ud.ah = h;
		w.wr.ud.remote_qpn = 0xffffff;
		w.wr.ud.remote_qkey = qkey;
		if (ibv_post_send(qp, &w, &bad))
			die("post_send %d", i);
		int t = 0;

		while (ibv_poll_cq(cq, 1, &wc) != 1 && t++ < 100000)
			usleep(100);
		if (wc.status != IBV_WC_SUCCESS)
			die("send %d: status %d", i, wc.status);
		/* Paced: UD has no flow control. */
		usleep(20000);
	}
	snprintf(line, sizeof(line), "sent %06x\n", qp->qp_num);
	sock_send(fd, line);
	if (sock_line(fd, line, sizeof(line)) || strcmp(line, "ok"))
		die("receiver: %s", line);
	printf("mcast-peer: ok sender: %d messages to group %s, all received\n", COUNT, GROUP);
	return 0;
}
