/*
 * Two processes forked from a parent that had already listed the RDMA
 * devices (as Python's multiprocessing makes them) connect to each other
 * through rdma_cm on the one device they share: through burstd on burst,
 * through the kernel's device on RXE. The children must not use the
 * parent's device contexts (on burst: its burstd connection).
 *
 * Usage: cm-fork ADDRESS [PORT]   (exit status 0: both established)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int wait_ev(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		   struct rdma_cm_id **id)
{
	struct rdma_cm_event *e;

	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		return -1;
	}
	int ok = e->event == want;
	if (!ok)
		fprintf(stderr, "[%d] %s (status %d), expected %s\n", getpid(),
			rdma_event_str(e->event), e->status, rdma_event_str(want));
	if (id)
		*id = e->id;
	rdma_ack_cm_event(e);
	return ok ? 0 : -1;
}

static int make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	return rdma_create_qp(id, NULL, &a);
}

static int server(struct sockaddr_in *a)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid, *cid;
	struct rdma_conn_param p = { 0 };

	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(lid, (struct sockaddr *)a) || rdma_listen(lid, 1)) {
		perror("server: listen");
		return 2;
	}
	if (wait_ev(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &cid) || make_qp(cid) ||
	    rdma_accept(cid, &p) || wait_ev(ch, RDMA_CM_EVENT_ESTABLISHED, NULL))
		return 3;
	printf("server: established\n");
	return 0;
}

static int client(struct sockaddr_in *a)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct rdma_conn_param p = { 0 };

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000) ||
	    wait_ev(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) ||
	    rdma_resolve_route(id, 2000) ||
	    wait_ev(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) || make_qp(id) ||
	    rdma_connect(id, &p) || wait_ev(ch, RDMA_CM_EVENT_ESTABLISHED, NULL)) {
		fprintf(stderr, "client: %s\n", strerror(errno));
		return 2;
	}
	printf("client: established\n");
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int n = 0, st[2];
	pid_t kid[2];

	if (argc < 2 || inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "usage: cm-fork ADDRESS [PORT]\n");
		return 100;
	}
	a.sin_port = htons(argc > 2 ? atoi(argv[2]) : 7471);
	setvbuf(stdout, NULL, _IONBF, 0);
	/* The parent lists (and so opens) the devices first. */
	struct ibv_context **list = rdma_get_devices(&n);
	printf("parent: %d device(s)\n", n);
	if (list)
		rdma_free_devices(list);
	kid[0] = fork();
	if (kid[0] == 0)
		_exit(server(&a));
	usleep(500000);
	kid[1] = fork();
	if (kid[1] == 0)
		_exit(client(&a));
	for (int i = 0; i < 2; i++) {
		if (waitpid(kid[i], &st[i], 0) < 0 || !WIFEXITED(st[i]))
			st[i] = 1 << 8;
	}
	printf("server exit %d, client exit %d\n", WEXITSTATUS(st[0]), WEXITSTATUS(st[1]));
	return WEXITSTATUS(st[0]) || WEXITSTATUS(st[1]);
}
