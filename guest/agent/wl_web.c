/* `web` workload: HTTP/1.1 GET/HEAD of files under /data, one forked process per
 * connection (Connection: close). "/" serves index.html; anything that could leave /data
 * (a ".." segment, a NUL, a symlink) is refused. */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define DOC_ROOT "/data"
#define REQ_MAX 8192
#define REQ_TIMEOUT_S 10

static void respond_status(int fd, int code, const char *reason)
{
	char body[128], head[256];
	int bl = snprintf(body, sizeof(body), "%d %s\n", code, reason);
	int hl = snprintf(head, sizeof(head),
			  "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
			  "Connection: close\r\n\r\n",
			  code, reason, bl);
	if (write_all(fd, head, (size_t)hl) == 0)
		write_all(fd, body, (size_t)bl);
}

static const char *content_type(const char *path)
{
	const char *dot = strrchr(path, '.');
	if (!dot)
		return "application/octet-stream";
	if (strcmp(dot, ".html") == 0 || strcmp(dot, ".htm") == 0)
		return "text/html; charset=utf-8";
	if (strcmp(dot, ".txt") == 0)
		return "text/plain; charset=utf-8";
	if (strcmp(dot, ".json") == 0)
		return "application/json";
	return "application/octet-stream";
}

/* Decodes the request target into a relative path under DOC_ROOT. Returns 0, or -1 when
 * the target is not acceptable. */
int web_target_to_path(const char *target, char *out, size_t cap)
{
	size_t n = 0;
	if (target[0] != '/')
		return -1;
	for (const char *p = target + 1; *p && *p != '?' && *p != '#'; p++) {
		char c = *p;
		if (c == '%') {
			int hi = hex_nibble(p[1]), lo = hi < 0 ? -1 : hex_nibble(p[2]);
			if (hi < 0 || lo < 0)
				return -1;
			c = (char)(hi << 4 | lo);
			p += 2;
		}
		if (c == '\0' || c == '\\' || n + 1 >= cap)
			return -1;
		out[n++] = c;
	}
	out[n] = '\0';
	if (n == 0 || out[n - 1] == '/') {
		if (n + sizeof("index.html") > cap)
			return -1;
		strcpy(out + n, "index.html");
	}
	/* Refuse any "." or ".." segment and empty segments ("a//b"). */
	return path_segments_ok(out) ? 0 : -1;
}

static void serve(int fd, int root)
{
	char req[REQ_MAX + 1], method[8], target[4096], version[16], path[4096];
	size_t got = 0;
	alarm(REQ_TIMEOUT_S); /* a silent client must not keep a process forever */
	while (got < REQ_MAX) {
		ssize_t n = read(fd, req + got, REQ_MAX - got);
		if (n <= 0)
			return;
		got += (size_t)n;
		req[got] = '\0';
		if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
			break;
	}
	req[got] = '\0';
	if (got == REQ_MAX && !strstr(req, "\r\n\r\n")) {
		respond_status(fd, 431, "Request Header Fields Too Large");
		return;
	}
	if (sscanf(req, "%7s %4095s %15s", method, target, version) != 3 ||
	    strncmp(version, "HTTP/1.", 7) != 0) {
		respond_status(fd, 400, "Bad Request");
		return;
	}
	int head = strcmp(method, "HEAD") == 0;
	if (!head && strcmp(method, "GET") != 0) {
		respond_status(fd, 405, "Method Not Allowed");
		return;
	}
	if (web_target_to_path(target, path, sizeof(path)) < 0) {
		respond_status(fd, 403, "Forbidden");
		return;
	}
	/* O_NOFOLLOW guards the last component; our data disk has no symlinks elsewhere. */
	int f = openat(root, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (f < 0 || fstat(f, &st) < 0 || !S_ISREG(st.st_mode)) {
		respond_status(fd, 404, "Not Found");
		return;
	}
	char hdr[512];
	int hl = snprintf(hdr, sizeof(hdr),
			  "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %lld\r\n"
			  "Connection: close\r\n\r\n",
			  content_type(path), (long long)st.st_size);
	if (write_all(fd, hdr, (size_t)hl) < 0 || head)
		return;
	off_t off = 0;
	while (off < st.st_size) {
		ssize_t n = sendfile(fd, f, &off, (size_t)(st.st_size - off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
	}
}

int wl_web(struct wl_ctx *ctx, int port)
{
	int lfd = listen_tcp(port);
	if (lfd < 0)
		return 1;
	int root = open(DOC_ROOT, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		logmsg("web: %s is missing: every request will get 404", DOC_ROOT);
	signal(SIGCHLD, SIG_IGN); /* connection processes reap themselves */
	logmsg("web: serving %s on port %d", DOC_ROOT, port);
	wl_disk_load(ctx);
	wl_ready(ctx);
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EINTR)
				usleep(10000);
			continue;
		}
		pid_t pid = fork();
		if (pid == 0) {
			close(lfd);
			close(ctx->out_fd);
			serve(fd, root);
			shutdown(fd, SHUT_WR);
			_exit(0);
		}
		close(fd);
	}
}
