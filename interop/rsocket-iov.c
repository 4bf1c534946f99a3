/* rsockets' vector calls: rwritev/rreadv and rsendmsg/rrecvmsg move every
 * buffer of an iovec array, in order (rdma-core's rrecvv read into the
 * first only). Usage: rsocket-iov s ADDR PORT | rsocket-iov c ADDR PORT.
 * Prints "rsocket-iov: ok" and exits 0 when the bytes went both ways. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define LEN 3000

static int fill(struct iovec *v, char *a, char *b, char *c)
{
	v[0].iov_base = a; v[0].iov_len = 100;
	v[1].iov_base = b; v[1].iov_len = 0;        /* an empty one in between */
	v[2].iov_base = c; v[2].iov_len = LEN - 100;
	return 3;
}

/* Reads until LEN bytes came (a stream read returns what it has; rdma-core's
 * rreadv and rrecvmsg fill only the first buffer, burst's all of them). */
static int read_all(int fd, char *a, char *c, int use_msg)
{
	char *b = NULL;
	size_t got = 0;
	while (got < LEN) {
		struct iovec v[3];
		fill(v, a, b, c);
		/* Skip what arrived already. */
		size_t skip = got;
		int first = 0;
		while (first < 3 && (skip >= v[first].iov_len)) { skip -= v[first].iov_len; first++; }
		/* rdma-core reads into the first buffer only: make it one with room. */
		while (first < 3 && v[first].iov_len == 0)
			first++;
		v[first].iov_base = (char *)v[first].iov_base + skip;
		v[first].iov_len -= skip;
		ssize_t n;
		if (use_msg) {
			struct msghdr m = { .msg_iov = &v[first], .msg_iovlen = 3 - first };
			n = rrecvmsg(fd, &m, 0);
		} else {
			n = rreadv(fd, &v[first], 3 - first);
		}
		if (n <= 0) { perror("rreadv/rrecvmsg"); return -1; }
		got += n;
	}
	return 0;
}

static int check(const char *a, const char *c, int seed)
{
	for (int i = 0; i < LEN; i++) {
		char want = (char)(i * 7 + seed);
		char have = i < 100 ? a[i] : c[i - 100];
		if (have != want) {
			fprintf(stderr, "byte %d: %d, expected %d\n", i, have, want);
			return -1;
		}
	}
	return 0;
}

static int write_all(int fd, int seed, int use_msg)
{
	static char a[100], c[LEN - 100];
	for (int i = 0; i < LEN; i++) {
		if (i < 100)
			a[i] = (char)(i * 7 + seed);
		else
			c[i - 100] = (char)(i * 7 + seed);
	}
	struct iovec v[3];
	fill(v, a, NULL, c);
	ssize_t n;
	if (use_msg) {
		struct msghdr m = { .msg_iov = v, .msg_iovlen = 3 };
		n = rsendmsg(fd, &m, 0);
	} else {
		n = rwritev(fd, v, 3);
	}
	if (n != LEN) { fprintf(stderr, "wrote %zd of %d\n", n, LEN); return -1; }
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) { fprintf(stderr, "usage: %s s|c ADDR PORT\n", argv[0]); return 2; }
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	inet_pton(AF_INET, argv[2], &sa.sin_addr);
	int fd = rsocket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) { perror("rsocket"); return 1; }
	static char a[100], c[LEN - 100];
	int server = argv[1][0] == 's';
	if (server) {
		if (rbind(fd, (struct sockaddr *)&sa, sizeof sa) || rlisten(fd, 1)) { perror("rbind/rlisten"); return 1; }
		int s = raccept(fd, NULL, NULL);
		if (s < 0) { perror("raccept"); return 1; }
		if (read_all(s, a, c, 0) || check(a, c, 1)) return 1;
		if (write_all(s, 2, 1)) return 1;
		if (read_all(s, a, c, 1) || check(a, c, 3)) return 1;
		rclose(s);
	} else {
		if (rconnect(fd, (struct sockaddr *)&sa, sizeof sa)) { perror("rconnect"); return 1; }
		if (write_all(fd, 1, 0)) return 1;
		if (read_all(fd, a, c, 1) || check(a, c, 2)) return 1;
		if (write_all(fd, 3, 1)) return 1;
	}
	rclose(fd);
	printf("rsocket-iov: ok\n");
	return 0;
}
