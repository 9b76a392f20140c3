/* Plumbing shared by the workload processes. */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
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

/* The block device mounted at `dir`, from /proc/mounts; 0 when none. */
static int device_of(const char *dir, char *out, size_t cap)
{
	FILE *f = fopen("/proc/mounts", "re");
	char dev[256], mnt[256];
	int found = 0;
	if (!f)
		return 0;
	while (!found && fscanf(f, "%255s %255s %*[^\n]", dev, mnt) == 2)
		if (strcmp(mnt, dir) == 0 && strncmp(dev, "/dev/", 5) == 0) {
			snprintf(out, cap, "%s", dev);
			found = 1;
		}
	fclose(f);
	return found;
}

void wl_disk_load(struct wl_ctx *ctx)
{
	uint64_t want = ctx->cfg->disk_io_bytes;
	char dev[256];
	if (!want)
		return;
	if (!device_of("/data", dev, sizeof(dev))) {
		logmsg("disk_io: no block device is mounted at /data: skipped");
		return;
	}
	/* O_DIRECT: every byte comes from the (virtual) disk, none from the guest's cache,
	 * so the job is disk-bound but needs little memory, like a boot that copies files. */
	int fd = open(dev, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		logmsg("disk_io: cannot open %s: %s", dev, strerror(errno));
		return;
	}
	const size_t chunk = 1 << 20;
	void *buf;
	if (posix_memalign(&buf, 4096, chunk) != 0) {
		close(fd);
		return;
	}
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	uint64_t done = 0;
	off_t at = 0;
	while (done < want) {
		ssize_t n = pread(fd, buf, chunk, at);
		if (n <= 0) {
			if (at == 0) {
				logmsg("disk_io: cannot read %s: %s", dev, n < 0 ? strerror(errno) : "empty");
				break;
			}
			at = 0; /* wrap around a disk smaller than the job */
			continue;
		}
		done += (uint64_t)n;
		at += n;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	logmsg("disk_io: read %llu MiB of %s in %.2f s", (unsigned long long)(done >> 20), dev, s);
	free(buf);
	close(fd);
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
