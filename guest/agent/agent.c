/* Rebound guest agent: talks JSON lines with the host over the virtio-serial port
 * org.rebound.agent (docs/agent-protocol.md), runs the workloads chosen on the kernel
 * command line in child processes, and feeds the watchdog.
 *
 * One poll loop, nothing in it blocks: the port is non-blocking, and while no host is
 * connected (the port reports POLLHUP and writes would fail with EAGAIN) messages are
 * dropped rather than queued, so a host that comes later gets fresh state by `hello`. */
#include <sys/ioctl.h>
#include <linux/watchdog.h>

#include "agent.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUTBUF_CAP (64 * 1024)
#define CHILD_LINE_MAX 4096
#define PORT_RETRY_MS 100
/* Without a virtio-serial port (a VM started without one) stop scanning sysfs 10x a second. */
#define PORT_SCAN_SLOW_AFTER_MS 10000
#define PORT_SCAN_SLOW_MS 1000
#define RESPAWN_DELAY_MS 1000
#define RESPAWN_DELAY_MAX_MS 30000

struct child {
	enum workload_kind kind;
	pid_t pid; /* 0: not running */
	int fd;    /* read end of its pipe, -1 when not running */
	int ready;
	uint64_t respawn_at;
	uint64_t respawn_delay; /* doubles while a workload keeps dying early */
	uint64_t started_at;
	char line[CHILD_LINE_MAX];
	size_t len;
};

static struct config cfg;
static struct child children[MAX_WORKLOADS];
static int port_fd = -1;
static int port_hup = 1;
static char inbuf[LINE_MAX_BYTES + 1];
static size_t inlen;
static int discarding;
static char outbuf[OUTBUF_CAP];
static size_t outlen;
static uint64_t dropped;
static int watchdog_fd = -1;
/* Set by the host's watchdog_stop: the watchdog then expires as for a hung guest. */
static int watchdog_starved;
static int all_ready_seen;

/* ---------- output ---------- */

static void port_lost(const char *why)
{
	if (!port_hup)
		logmsg("host disconnected (%s)", why);
	port_hup = 1;
	outlen = 0;
	inlen = 0;
	discarding = 0;
}

static void flush_out(void)
{
	while (outlen && port_fd >= 0 && !port_hup) {
		ssize_t n = write(port_fd, outbuf, outlen);
		if (n > 0) {
			memmove(outbuf, outbuf + n, outlen - (size_t)n);
			outlen -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return; /* poll tells us when it drains */
		port_lost(n < 0 ? strerror(errno) : "write returned 0");
	}
}

/* Queues one complete line; a line that does not fit is dropped whole so the host never
 * sees half a message. */
static void send_line(const char *line, size_t len)
{
	if (port_fd < 0 || port_hup || outlen + len > sizeof(outbuf)) {
		dropped++;
		return;
	}
	memcpy(outbuf + outlen, line, len);
	outlen += len;
	flush_out();
}

static void send_jb(struct jbuf *b)
{
	int n = jb_finish(b);
	if (n > 0)
		send_line(b->buf, (size_t)n);
}

static void send_error(const char *msg)
{
	char buf[1024];
	struct jbuf b;
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"error\",\"message\":");
	jb_str(&b, msg);
	send_jb(&b);
}

static int workloads_ready(void)
{
	for (int i = 0; i < cfg.nworkloads; i++)
		if (!children[i].ready)
			return 0;
	return 1;
}

static void send_ready(void)
{
	struct sysinfo_facts f;
	char buf[1024];
	struct jbuf b;
	int sp = service_port(&cfg);
	sysinfo_collect(&f);
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"ready\",\"agent_version\":");
	jb_u64(&b, AGENT_VERSION);
	jb_raw(&b, ",\"kernel_release\":");
	jb_str(&b, f.kernel_release);
	jb_raw(&b, ",\"mem_total_kib\":");
	jb_u64(&b, f.mem_total_kib);
	jb_raw(&b, ",\"vmcoreinfo\":");
	if (f.has_vmcoreinfo) {
		jb_raw(&b, "{\"paddr\":");
		jb_u64(&b, f.vmcoreinfo_paddr);
		jb_raw(&b, ",\"size\":");
		jb_u64(&b, f.vmcoreinfo_size);
		jb_raw(&b, "}");
	} else {
		jb_raw(&b, "null");
	}
	jb_raw(&b, ",\"evict_ring\":");
	if (f.evict_ring_bytes) {
		jb_raw(&b, "{\"gpa\":");
		jb_u64(&b, f.evict_ring_gpa);
		jb_raw(&b, ",\"bytes\":");
		jb_u64(&b, f.evict_ring_bytes);
		jb_raw(&b, "}");
	} else {
		jb_raw(&b, "null");
	}
	jb_raw(&b, ",\"workload\":");
	jb_str(&b, cfg.workload);
	jb_raw(&b, ",\"service_port\":");
	if (sp)
		jb_u64(&b, (uint64_t)sp);
	else
		jb_raw(&b, "null");
	jb_raw(&b, ",\"uptime_ms\":");
	jb_u64(&b, uptime_ms());
	send_jb(&b);
}

static void check_ready(void)
{
	if (!all_ready_seen && workloads_ready()) {
		all_ready_seen = 1;
		logmsg("ready (workload %s) at %llu ms uptime", cfg.workload,
		       (unsigned long long)uptime_ms());
		send_ready();
	}
}

/* ---------- host commands ---------- */

static void do_marker(const struct host_cmd *c)
{
	char err[160], buf[256];
	uint64_t paddr;
	size_t len;
	struct jbuf b;
	if (!c->has_id || !c->has_value_hex) {
		send_error("marker needs \"id\" and \"value_hex\"");
		return;
	}
	if (marker_place(c->value_hex, &paddr, &len, err, sizeof(err)) < 0) {
		send_error(err);
		return;
	}
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"marker\",\"id\":");
	jb_u64(&b, c->id);
	jb_raw(&b, ",\"paddr\":");
	jb_u64(&b, paddr);
	jb_raw(&b, ",\"len\":");
	jb_u64(&b, len);
	send_jb(&b);
}

static void do_crash(void)
{
	logmsg("crash requested by the host");
	int fd = open("/proc/sysrq-trigger", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "c", 1) != 1) {
		char msg[128];
		snprintf(msg, sizeof(msg), "crash: cannot write /proc/sysrq-trigger: %s", strerror(errno));
		send_error(msg);
	}
	if (fd >= 0)
		close(fd);
}

static void do_poweroff(void)
{
	logmsg("poweroff requested by the host");
	flush_out();
	sync();
	reboot(RB_POWER_OFF);
	send_error("poweroff failed");
}

/* Like send_line, but waits (up to 5 s per line) for the port to drain: a cache list
 * is many lines that must all arrive. */
static void send_line_wait(const char *line, size_t len)
{
	while (port_fd >= 0 && !port_hup && outlen + len > sizeof(outbuf)) {
		struct pollfd p = { port_fd, POLLOUT, 0 };
		if (poll(&p, 1, 5000) <= 0) {
			port_lost("port did not drain in 5 s");
			break;
		}
		flush_out();
	}
	send_line(line, len);
}

struct cl_msg {
	uint64_t id;
	struct warm_counts *counts;
};

static void cachelist_emit(const char *text, size_t len, int last, void *arg)
{
	static char buf[LINE_MAX_BYTES];
	struct cl_msg *m = arg;
	struct jbuf b;
	(void)len;
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"cachelist\",\"id\":");
	jb_u64(&b, m->id);
	jb_raw(&b, ",\"last\":");
	jb_u64(&b, (uint64_t)last);
	if (last) {
		jb_raw(&b, ",\"cached_files\":");
		jb_u64(&b, m->counts->files);
		jb_raw(&b, ",\"cached_pages\":");
		jb_u64(&b, m->counts->pages);
		jb_raw(&b, ",\"skipped\":");
		jb_u64(&b, m->counts->skipped);
	}
	jb_raw(&b, ",\"files\":");
	jb_str(&b, text);
	int n = jb_finish(&b);
	if (n > 0)
		send_line_wait(b.buf, (size_t)n);
	else
		send_error("cachelist: a chunk did not fit in one line");
}

static void do_cachelist(const struct host_cmd *c)
{
	struct warm_counts counts;
	struct cl_msg m = { c->id, &counts };
	if (!c->has_id) {
		send_error("cachelist needs \"id\"");
		return;
	}
	/* The walk counts as it goes; the last chunk carries the totals. */
	memset(&counts, 0, sizeof(counts));
	uint64_t t0 = now_ms();
	if (warm_cachelist(cachelist_emit, &m, &counts) < 0)
		logmsg("cachelist: walking /data failed: %s", strerror(errno));
	logmsg("cachelist: %llu pages of %llu files in %llu ms", (unsigned long long)counts.pages,
	       (unsigned long long)counts.files, (unsigned long long)(now_ms() - t0));
}

/* ---------- prefetch: the list arrives in chunks, a child reads it ---------- */

#define PREFETCH_LIST "/run/rebound-prefetch.list"
static struct {
	uint64_t recv_id; /* the list being received (0: none) */
	int recv_fd;
	pid_t pid;
	int fd;
	char line[512];
	size_t len;
} pf = { 0, -1, 0, -1, "", 0 };

static void prefetch_child(uint64_t id, int out)
{
	struct warm_counts n;
	char buf[512];
	struct jbuf b;
	uint64_t t0 = now_ms();
	warm_prefetch(PREFETCH_LIST, &n);
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"prefetch\",\"id\":");
	jb_u64(&b, id);
	jb_raw(&b, ",\"files\":");
	jb_u64(&b, n.files);
	jb_raw(&b, ",\"pages\":");
	jb_u64(&b, n.pages);
	jb_raw(&b, ",\"bytes\":");
	jb_u64(&b, n.bytes);
	jb_raw(&b, ",\"missing\":");
	jb_u64(&b, n.missing);
	jb_raw(&b, ",\"skipped\":");
	jb_u64(&b, n.skipped);
	jb_raw(&b, ",\"ms\":");
	jb_u64(&b, now_ms() - t0);
	int len = jb_finish(&b);
	if (len > 0)
		write_all(out, b.buf, (size_t)len);
}

static void do_prefetch(const struct host_cmd *c)
{
	if (!c->has_id || !c->has_files || !c->has_last) {
		send_error("prefetch needs \"id\", \"last\" and \"files\"");
		return;
	}
	if (pf.pid) {
		send_error("prefetch: one is already running");
		return;
	}
	if (c->id != pf.recv_id) {
		if (pf.recv_fd >= 0)
			close(pf.recv_fd);
		pf.recv_fd = open(PREFETCH_LIST, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		pf.recv_id = c->id;
	}
	if (pf.recv_fd < 0 || write_all(pf.recv_fd, c->files, strlen(c->files)) < 0) {
		send_error("prefetch: cannot keep the list in " PREFETCH_LIST);
		pf.recv_id = 0;
		return;
	}
	if (!c->last)
		return;
	close(pf.recv_fd);
	pf.recv_fd = -1;
	pf.recv_id = 0;
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0) {
		send_error("prefetch: pipe failed");
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(fds[0]);
		prefetch_child(c->id, fds[1]);
		_exit(0);
	}
	close(fds[1]);
	if (pid < 0) {
		close(fds[0]);
		send_error("prefetch: fork failed");
		return;
	}
	fcntl(fds[0], F_SETFL, O_NONBLOCK);
	pf.pid = pid;
	pf.fd = fds[0];
	pf.len = 0;
	logmsg("prefetch started (pid %d)", (int)pid);
}

static void read_prefetch(void)
{
	for (;;) {
		ssize_t n = read(pf.fd, pf.line + pf.len, sizeof(pf.line) - 1 - pf.len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n > 0) {
			pf.len += (size_t)n;
			if (pf.len == sizeof(pf.line) - 1)
				pf.len = 0;
			continue;
		}
		close(pf.fd);
		pf.fd = -1;
		waitpid(pf.pid, NULL, 0);
		pf.pid = 0;
		if (pf.len && pf.line[pf.len - 1] == '\n') {
			logmsg("prefetch done: %.*s", (int)pf.len - 1, pf.line);
			send_line(pf.line, pf.len);
		} else {
			send_error("prefetch: the reader died before reporting");
		}
		return;
	}
}

static void do_reboot(void)
{
	logmsg("reboot requested by the host");
	flush_out();
	sync();
	/* Tells the host the disks are synced: if the kernel then hangs on its way down,
	 * the host may reset the machine without losing anything. */
	static const char done[] = "{\"type\":\"rebooting\"}\n";
	send_line_wait(done, sizeof(done) - 1);
	reboot(RB_AUTOBOOT);
	send_error("reboot failed");
}

static void handle_line(char *line, size_t len)
{
	static struct host_cmd c; /* holds a 64 KiB list: not on the stack */
	char err[128], msg[200];
	if (len && line[len - 1] == '\r')
		len--;
	if (len == 0)
		return;
	if (json_parse_cmd(line, len, &c, err, sizeof(err)) < 0) {
		snprintf(msg, sizeof(msg), "malformed command: %s", err);
		send_error(msg);
		return;
	}
	if (!c.has_cmd) {
		send_error("malformed command: missing \"cmd\"");
		return;
	}
	if (strcmp(c.cmd, "hello") == 0) {
		if (all_ready_seen)
			send_ready();
	} else if (strcmp(c.cmd, "crash") == 0) {
		do_crash();
	} else if (strcmp(c.cmd, "marker") == 0) {
		do_marker(&c);
	} else if (strcmp(c.cmd, "poweroff") == 0) {
		do_poweroff();
	} else if (strcmp(c.cmd, "reboot") == 0) {
		do_reboot();
	} else if (strcmp(c.cmd, "cachelist") == 0) {
		do_cachelist(&c);
	} else if (strcmp(c.cmd, "prefetch") == 0) {
		do_prefetch(&c);
	} else if (strcmp(c.cmd, "watchdog_stop") == 0) {
		logmsg("watchdog_stop: no longer feeding /dev/watchdog");
		watchdog_starved = 1;
	} else {
		snprintf(msg, sizeof(msg), "unknown command \"%.40s\"", c.cmd);
		send_error(msg);
	}
}

static void read_port(void)
{
	for (;;) {
		ssize_t n = read(port_fd, inbuf + inlen, LINE_MAX_BYTES - inlen);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			port_lost(n == 0 ? "end of file" : strerror(errno));
			return;
		}
		size_t start = 0, end = inlen + (size_t)n;
		for (size_t i = inlen; i < end; i++) {
			if (inbuf[i] != '\n')
				continue;
			if (!discarding)
				handle_line(inbuf + start, i - start);
			discarding = 0;
			start = i + 1;
			if (port_hup)
				return; /* port_lost() dropped the rest: it belonged to the old host */
		}
		memmove(inbuf, inbuf + start, end - start);
		inlen = end - start;
		if (inlen == LINE_MAX_BYTES) {
			if (!discarding)
				send_error("command line longer than 65536 bytes: ignored");
			discarding = 1;
			inlen = 0;
		}
		if (port_hup)
			return;
	}
}

/* ---------- port connection state ---------- */

static void check_port(void)
{
	static uint64_t started, next_scan;
	if (port_fd < 0) {
		uint64_t now = now_ms();
		if (!started)
			started = now;
		if (now < next_scan)
			return;
		next_scan = now + (now - started > PORT_SCAN_SLOW_AFTER_MS ? PORT_SCAN_SLOW_MS : 0);
		port_fd = port_open();
		if (port_fd < 0)
			return;
		port_hup = 1;
	}
	if (!port_hup)
		return;
	struct pollfd p = { port_fd, POLLIN, 0 };
	if (poll(&p, 1, 0) < 0 || (p.revents & POLLHUP))
		return;
	port_hup = 0;
	logmsg("host connected");
	/* A host that connected after we became ready still learns it without asking. */
	if (all_ready_seen)
		send_ready();
}

/* ---------- workloads ---------- */

static void spawn(struct child *ch)
{
	int fds[2];
	ch->respawn_at = now_ms() + RESPAWN_DELAY_MS; /* if this attempt fails */
	if (pipe2(fds, O_CLOEXEC) < 0) {
		logmsg("pipe: %s", strerror(errno));
		return;
	}
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		logmsg("fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return;
	}
	if (pid == 0) {
		/* A workload must not outlive its agent: a respawned agent starts fresh ones. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		close(fds[0]);
		if (port_fd >= 0)
			close(port_fd);
		if (watchdog_fd >= 0)
			close(watchdog_fd);
		fcntl(fds[1], F_SETFL, O_NONBLOCK);
		signal(SIGPIPE, SIG_IGN);
		struct wl_ctx ctx = { &cfg, fds[1] };
		int rc = 1;
		switch (ch->kind) {
		case WL_WEB: rc = wl_web(&ctx, workload_port(&cfg, WL_WEB)); break;
		case WL_KV: rc = wl_kv(&ctx, workload_port(&cfg, WL_KV)); break;
		case WL_MEMFILL: rc = wl_memfill(&ctx); break;
		case WL_IO: rc = wl_io(&ctx); break;
		case WL_COUNTER: rc = wl_counter(&ctx); break;
		case WL_PEER: rc = wl_peer(&ctx); break;
		case WL_FLOOD: rc = wl_flood(&ctx); break;
		}
		_exit(rc);
	}
	close(fds[1]);
	fcntl(fds[0], F_SETFL, O_NONBLOCK);
	ch->pid = pid;
	ch->started_at = now_ms();
	ch->fd = fds[0];
	ch->len = 0;
	ch->ready = 0;
	logmsg("started workload %s (pid %d)", workload_name(ch->kind), (int)pid);
}

static void child_line(struct child *ch, char *line, size_t len)
{
	if (len == 5 && memcmp(line, "READY", 5) == 0) {
		ch->ready = 1;
		check_ready();
		return;
	}
	if (len == 0 || line[0] != '{')
		return;
	line[len] = '\n';
	send_line(line, len + 1);
}

static void child_exited(struct child *ch)
{
	int status = 0;
	char msg[160];
	close(ch->fd);
	ch->fd = -1;
	if (waitpid(ch->pid, &status, 0) < 0)
		status = -1;
	ch->pid = 0;
	/* A workload that ran a while restarts after 1 s; one that keeps dying (e.g. killed
	 * by the OOM killer right away) backs off up to 30 s instead of spinning. */
	if (now_ms() - ch->started_at > RESPAWN_DELAY_MAX_MS || ch->respawn_delay == 0)
		ch->respawn_delay = RESPAWN_DELAY_MS;
	else if (ch->respawn_delay < RESPAWN_DELAY_MAX_MS)
		ch->respawn_delay *= 2;
	ch->respawn_at = now_ms() + ch->respawn_delay;
	if (WIFSIGNALED(status))
		snprintf(msg, sizeof(msg), "workload %s died of signal %d; restarting it in %llu s",
			 workload_name(ch->kind), WTERMSIG(status), (unsigned long long)(ch->respawn_delay / 1000));
	else
		snprintf(msg, sizeof(msg), "workload %s exited with status %d; restarting it in %llu s",
			 workload_name(ch->kind), WEXITSTATUS(status), (unsigned long long)(ch->respawn_delay / 1000));
	logmsg("%s", msg);
	send_error(msg);
}

static void read_child(struct child *ch)
{
	for (;;) {
		ssize_t n = read(ch->fd, ch->line + ch->len, sizeof(ch->line) - 1 - ch->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			child_exited(ch);
			return;
		}
		size_t start = 0, end = ch->len + (size_t)n;
		for (size_t i = ch->len; i < end; i++) {
			if (ch->line[i] == '\n') {
				child_line(ch, ch->line + start, i - start);
				start = i + 1;
			}
		}
		memmove(ch->line, ch->line + start, end - start);
		ch->len = end - start;
		if (ch->len == sizeof(ch->line) - 1)
			ch->len = 0; /* our own workloads never write such lines */
	}
}

/* ---------- once a second ---------- */

static void tick(uint64_t seq)
{
	char buf[96];
	struct jbuf b;
	if (watchdog_fd < 0 && access("/dev/watchdog", F_OK) == 0) {
		watchdog_fd = open("/dev/watchdog", O_WRONLY | O_CLOEXEC);
		if (watchdog_fd >= 0) {
			int t = (int)cfg.watchdog_s;
			if (t && ioctl(watchdog_fd, WDIOC_SETTIMEOUT, &t) < 0)
				logmsg("watchdog timeout %d s: %s", (int)cfg.watchdog_s, strerror(errno));
			logmsg("feeding /dev/watchdog");
		}
	}
	if (watchdog_fd >= 0 && !watchdog_starved && write(watchdog_fd, "k", 1) != 1)
		logmsg("watchdog write: %s", strerror(errno));
	jb_init(&b, buf, sizeof(buf));
	jb_raw(&b, "{\"type\":\"heartbeat\",\"seq\":");
	jb_u64(&b, seq);
	send_jb(&b);
}

int main(void)
{
	char cmdline[4096], err[160];
	signal(SIGPIPE, SIG_IGN);
	if (read_small_file("/proc/cmdline", cmdline, sizeof(cmdline)) < 0)
		cmdline[0] = '\0';
	int problems = parse_cmdline(cmdline, &cfg, err, sizeof(err));
	if (problems)
		logmsg("%s", err);
	logmsg("starting (workload %s)", cfg.workload);

	for (int i = 0; i < cfg.nworkloads; i++) {
		children[i].kind = cfg.workloads[i];
		children[i].fd = -1;
		spawn(&children[i]);
	}
	check_port();
	check_ready();

	uint64_t hb_seq = 0, next_tick = now_ms() + 1000;
	int reported_problems = 0;
	for (;;) {
		struct pollfd pfds[2 + MAX_WORKLOADS];
		struct child *owners[2 + MAX_WORKLOADS];
		int pf_slot = -1;
		int n = 0;
		uint64_t now = now_ms();
		int timeout = next_tick > now ? (int)(next_tick - now) : 0;

		if (port_fd >= 0 && !port_hup) {
			pfds[n] = (struct pollfd){ port_fd, POLLIN | (outlen ? POLLOUT : 0), 0 };
			owners[n++] = NULL;
		} else if (timeout > PORT_RETRY_MS) {
			timeout = PORT_RETRY_MS;
		}
		for (int i = 0; i < cfg.nworkloads; i++) {
			if (children[i].fd >= 0) {
				pfds[n] = (struct pollfd){ children[i].fd, POLLIN, 0 };
				owners[n++] = &children[i];
			} else if (children[i].pid == 0) {
				uint64_t wait = children[i].respawn_at > now ? children[i].respawn_at - now : 0;
				if ((int)wait < timeout)
					timeout = (int)wait;
			}
		}

		if (pf.fd >= 0) {
			pf_slot = n;
			pfds[n] = (struct pollfd){ pf.fd, POLLIN, 0 };
			owners[n++] = NULL;
		}

		int rc = poll(pfds, (nfds_t)n, timeout);
		if (rc < 0 && errno != EINTR) {
			logmsg("poll: %s", strerror(errno));
			sleep(1);
		}
		for (int i = 0; rc > 0 && i < n; i++) {
			if (!pfds[i].revents)
				continue;
			if (owners[i]) {
				read_child(owners[i]);
				continue;
			}
			if (i == pf_slot) {
				read_prefetch();
				continue;
			}
			if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
				read_port();
			if (!port_hup && (pfds[i].revents & POLLHUP))
				port_lost("hang-up");
			if (!port_hup && (pfds[i].revents & POLLOUT))
				flush_out();
		}

		now = now_ms();
		for (int i = 0; i < cfg.nworkloads; i++)
			if (children[i].pid == 0 && now >= children[i].respawn_at)
				spawn(&children[i]);
		check_port();
		if (problems && !reported_problems && !port_hup) {
			send_error(err);
			reported_problems = 1;
		}
		if (now >= next_tick) {
			tick(++hb_seq);
			next_tick += 1000;
			if (next_tick <= now)
				next_tick = now + 1000; /* we were stopped (e.g. paused VM): do not burst */
		}
	}
}
