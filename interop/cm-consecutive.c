/*
 * Consecutive rdma_cm connections between two long-running processes:
 * the server listens once and accepts N connections one after another, the
 * client process makes them one after another, each torn down (disconnect,
 * DISCONNECTED on both sides, QP and id destroyed) before the next. What a
 * test runner or middleware does across its tests (issue 35: a server that
 * rejected the third).
 *
 * usage: cm-consecutive s ADDR N PORT   (server, binds ADDR)
 *        cm-consecutive c ADDR N PORT   (client, connects to ADDR)
 * Prints "connection I done" per connection; exits 0 when all N were.
 */
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type want, const char *who, int i)
{
	struct rdma_cm_event *e;

	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		exit(2);
	}
	if (e->event != want) {
		printf("%s: connection %d: %s (status %d), expected %s\n", who, i,
		       rdma_event_str(e->event), e->status, rdma_event_str(want));
		exit(3);
	}
	return e;
}

static void ack(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		const char *who, int i)
{
	rdma_ack_cm_event(expect(ch, want, who, i));
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	return a;
}

int main(int argc, char **argv)
{
	if (argc != 5 || (strcmp(argv[1], "s") && strcmp(argv[1], "c"))) {
		fprintf(stderr, "usage: %s s|c ADDR N PORT\n", argv[0]);
		return 100;
	}
	int n = atoi(argv[3]);
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons(atoi(argv[4]));
	if (inet_pton(AF_INET, argv[2], &sa.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[2]);
		return 100;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) {
		perror("rdma_create_event_channel");
		return 1;
	}
	struct rdma_conn_param param;
	memset(&param, 0, sizeof(param));
	if (!strcmp(argv[1], "s")) {
		struct rdma_cm_id *listen;
		if (rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) ||
		    rdma_bind_addr(listen, (struct sockaddr *)&sa) || rdma_listen(listen, 8)) {
			perror("listen");
			return 1;
		}
		for (int i = 0; i < n; i++) {
			struct rdma_cm_event *e =
				expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "server", i);
			struct rdma_cm_id *id = e->id;
			rdma_ack_cm_event(e);
			struct ibv_qp_init_attr a = qp_attr();
			if (rdma_create_qp(id, NULL, &a) || rdma_accept(id, &param)) {
				perror("create_qp/accept");
				return 1;
			}
			ack(ch, RDMA_CM_EVENT_ESTABLISHED, "server", i);
			ack(ch, RDMA_CM_EVENT_DISCONNECTED, "server", i);
			rdma_destroy_qp(id);
			rdma_destroy_id(id);
			printf("server: connection %d done\n", i);
			fflush(stdout);
		}
		rdma_destroy_id(listen);
	} else {
		for (int i = 0; i < n; i++) {
			struct rdma_cm_id *id;
			if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
			    rdma_resolve_addr(id, NULL, (struct sockaddr *)&sa, 2000)) {
				perror("resolve_addr");
				return 1;
			}
			ack(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "client", i);
			if (rdma_resolve_route(id, 2000)) {
				perror("resolve_route");
				return 1;
			}
			ack(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "client", i);
			struct ibv_qp_init_attr a = qp_attr();
			if (rdma_create_qp(id, NULL, &a) || rdma_connect(id, &param)) {
				perror("create_qp/connect");
				return 1;
			}
			ack(ch, RDMA_CM_EVENT_ESTABLISHED, "client", i);
			rdma_disconnect(id);
			ack(ch, RDMA_CM_EVENT_DISCONNECTED, "client", i);
			rdma_destroy_qp(id);
			rdma_destroy_id(id);
			printf("client: connection %d done\n", i);
			fflush(stdout);
		}
	}
	rdma_destroy_event_channel(ch);
	return 0;
}
