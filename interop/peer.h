/*
 * The out-of-band part of burst's two-sided interop programs (mw-peer,
 * mcast-peer): one TCP connection for a few text lines, and a failure
 * line that xtask reads. Include after defining PEER (the program's name).
 */
#ifndef BURST_INTEROP_PEER_H
#define BURST_INTEROP_PEER_H

#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Prints "PEER: FAIL why" and exits 1. */
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf(PEER ": FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	exit(1);
}

/* Reads one line (without its newline) into buf; -1 at EOF. */
static int sock_line(int fd, char *buf, size_t n)
{
	size_t got = 0;

	while (got + 1 < n) {
		ssize_t r = read(fd, buf + got, 1);

		if (r <= 0)
			return -1;
		if (buf[got] == '\n')
			break;
		got++;
	}
	buf[got] = 0;
	return 0;
}

/* Sends `s`; dies if it cannot. */
static void sock_send(int fd, const char *s)
{
	if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
		die("tcp write");
}

/* The client connects to host:port (retrying for 30 s); the server
 * (host NULL) accepts one connection on port. */
static int tcp(const char *host, int port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	char p[16];
	int fd;

	snprintf(p, sizeof(p), "%d", port);
	if (host) {
		if (getaddrinfo(host, p, &hints, &res))
			die("resolve %s", host);
		for (int i = 0; i < 300; i++) {
			fd = socket(AF_INET, SOCK_STREAM, 0);
			if (!connect(fd, res->ai_addr, res->ai_addrlen))
				return fd;
			close(fd);
			usleep(100000);
		}
		die("connect %s:%d", host, port);
	}
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1))
		die("listen on %d", port);
	fd = accept(l, NULL, NULL);
	close(l);
	if (fd < 0)
		die("accept");
	return fd;
}

#endif
