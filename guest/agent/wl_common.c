/* Plumbing shared by the workload processes. */
#include "agent.h"

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void wl_send(struct wl_ctx *ctx, const char *line)
{
	size_t n = strlen(line);
	/* Lines are < PIPE_BUF, so a write is all or nothing; when the agent lags we drop. */
	if (write(ctx->out_fd, line, n) < 0)
		return;
}

void wl_ready(struct wl_ctx *ctx)
{
	wl_send(ctx, "READY\n");
}

int listen_tcp(int port)
{
	struct sockaddr_in a;
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0) {
		logmsg("cannot listen on port %d: %m", port);
		close(fd);
		return -1;
	}
	return fd;
}
