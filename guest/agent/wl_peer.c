/* `peer` workload: one node of a cluster (HotRestore section 6.2: distcc-like client/server
 * or Elasticsearch-like all-to-all), so the host can see how a cluster restore disrupts it.
 *
 * One poll loop, nothing blocks. The node listens on rebound.peer_port for peers and host
 * clients, and keeps one outgoing TCP connection to each peer of rebound.peers, on which it
 * sends a heartbeat every peer_hb_ms and a request every peer_req_ms. Lines (all '\n'):
 *   HB <seq>             -> HBACK <seq>
 *   REQ <id> <payload>   -> REP <id> <fnv1a-64 of payload, 16 hex digits>
 *   QUERY <id>           -> RESULT <id> <peers_answered> <ms>  (a request to every
 *                           connected peer; answered when all replied or after peer_dead_ms)
 *   STATS                -> the {"type":"peer",...} JSON line
 *   anything else        -> ERR usage: ...
 * Any connection to peer_port may send any of these; the node's own replies come back only
 * on its outgoing connections. Each second, and when a peer is declared dead or alive, one
 * {"type":"peer",...} line goes to the host (and a {"type":"peer_event",...} line per change).
 *
 * Time across a pause (snapshot and restore, possibly seconds later, peers resumed at
 * different times). The guest's CLOCK_MONOTONIC may or may not include a pause of the VM, so
 * every duration here (silence, heartbeat timeouts, RTTs, query times, timers) is measured on
 * a "running clock": CLOCK_MONOTONIC advanced one loop turn at a time (a turn normally waits
 * at most 50 ms), each turn counted at most STEP_MAX_US (100 ms). A pause of the whole VM thus
 * counts 0.1 s at most, whatever the guest clock does; so does a turn in which this process
 * was not scheduled for long (the same thing from the peers' side; a starved guest's clock
 * runs slow, which only delays verdicts). Consequences:
 *   - a peer is declared dead only after peer_dead_ms of silence while this VM ran: after a
 *     whole-cluster restore, a peer resumed later than us is declared dead once we have run
 *     peer_dead_ms without hearing it, and alive again as soon as anything arrives from it.
 *     Input is read before silence is checked. Peers only answer what we send, so after our
 *     own pause nothing of theirs is waiting: their silence then is up to one heartbeat period
 *     before the pause, 0.1 s for the pause and one RTT after it, so our own pause does not
 *     kill a peer as long as peer_dead_ms > peer_hb_ms + 100 ms + an RTT (the defaults, 200
 *     and 1000, leave room; keep peer_dead_ms at least twice peer_hb_ms plus 100 ms).
 *   - a peer never heard since the workload started is not declared dead (it may boot later);
 *     `connected` < `peers` shows it.
 *   - RTT percentiles cover the requests answered since the previous report line, so one
 *     long pause does not stay in rtt_max forever; the counters are cumulative.
 * A connection is not closed when its peer is declared dead: a restored cluster keeps its TCP
 * connections (they are in the snapshots), and the kernel's retransmission backoff towards a
 * peer restored later is exactly what we want to see (RTTs, retrans_segs). A connection the
 * peer closes or resets is re-established after 100 ms, doubling to 1 s while it fails; a
 * connect that has not completed after max(peer_dead_ms, 1 s) of running time is retried. */
#include "agent.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CLIENT_MAX 64 /* incoming connections: peers and host clients */
#define QUERY_MAX 64
#define FIFO_LEN 256 /* heartbeats or requests awaiting an answer, per peer */
#define LINE_CAP (PEER_REQ_BYTES_MAX + 128)
#define OUT_HIGH (256 * 1024) /* unsent bytes beyond which we stop producing or reading */
#define POLL_MAX_MS 50
#define STEP_MAX_US 100000ULL
#define JUMP_LOG_US 1000000ULL /* turns this long are logged: likely a pause */
#define BACKOFF_MIN_US 100000ULL
#define BACKOFF_MAX_US 1000000ULL
#define REPORT_US 1000000ULL
#define RTT_SAMPLES 4096
#define QUERY_ID_MAX 64
#define STATS_LINE_MAX 2048 /* also under the agent's 4 KiB child-line limit */
#define USAGE "ERR usage: HB n | REQ id payload | QUERY id | STATS\n"

struct buf {
	char *p;
	size_t len, cap;
};

struct pending {
	uint64_t id, sent, sum;
	int query; /* slot of the QUERY it belongs to, -1 for a periodic request */
	uint32_t qserial;
	int timed_out;
};

struct fifo {
	struct pending e[FIFO_LEN];
	unsigned head, n;
};

enum conn_state { C_IDLE, C_CONNECTING, C_UP };

struct peer {
	struct peer_addr addr;
	char name[24];
	int fd;
	enum conn_state st;
	uint64_t retry_at, backoff, connect_at, next_hb, next_req, hb_seq;
	struct buf in, out;
	struct fifo hb, req;
	uint64_t last_heard;
	int heard, dead;
};

struct client {
	int fd;
	struct buf in, out;
};

struct query {
	int active, client;
	uint32_t serial;
	char id[QUERY_ID_MAX + 1];
	uint64_t start;
	int expected, answered;
};

static struct {
	const struct config *cfg;
	struct wl_ctx *ctx;
	uint64_t run, last_mono; /* the running clock (µs) and the CLOCK_MONOTONIC it last saw */
	uint64_t dead_us;
	int lfd;
	int npeers;
	struct peer peers[PEER_MAX];
	struct client clients[CLIENT_MAX];
	struct query queries[QUERY_MAX];
	uint32_t qserial;
	uint64_t next_id, next_report, retrans_base;
	int has_retrans;
	uint64_t hb_sent, hb_acked, hb_timeouts, declared_dead, req_sent, req_answered, req_bad;
	uint32_t rtt[RTT_SAMPLES];
	size_t nrtt;
	uint64_t rtt_max;
} S;

/* ---------- pure parts (unit-tested) ---------- */

uint64_t peer_checksum(const char *p, size_t n)
{
	uint64_t h = 14695981039346656037ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
	return h;
}

/* A decimal u64 of at most 20 digits ending at a space or the end; returns its length or -1. */
static int parse_dec(const char *s, size_t len, uint64_t *v)
{
	size_t i = 0;
	*v = 0;
	while (i < len && s[i] >= '0' && s[i] <= '9') {
		unsigned d = (unsigned)(s[i] - '0');
		if (*v > (UINT64_MAX - d) / 10)
			return -1;
		*v = *v * 10 + d;
		i++;
	}
	if (i == 0 || (i < len && s[i] != ' '))
		return -1;
	return (int)i;
}

int peer_exec(const char *line, size_t len, char *out, size_t cap)
{
	uint64_t v;
	int n;
	if ((len == 5 && memcmp(line, "STATS", 5) == 0) || (len > 6 && memcmp(line, "QUERY ", 6) == 0))
		return -1;
	if (len > 3 && memcmp(line, "HB ", 3) == 0 && parse_dec(line + 3, len - 3, &v) == (int)(len - 3)) {
		snprintf(out, cap, "HBACK %llu\n", (unsigned long long)v);
	} else if (len > 4 && memcmp(line, "REQ ", 4) == 0 && (n = parse_dec(line + 4, len - 4, &v)) > 0 &&
		   (size_t)n + 4 < len) {
		const char *payload = line + 4 + n + 1;
		uint64_t sum = peer_checksum(payload, len - (size_t)(payload - line));
		snprintf(out, cap, "REP %llu %016llx\n", (unsigned long long)v, (unsigned long long)sum);
	} else {
		snprintf(out, cap, "%s", USAGE);
	}
	return 0;
}

/* Index of token `name` in the space-separated tokens of [s, end); -1 when absent. */
static int token_index(const char *s, const char *end, const char *name)
{
	size_t nl = strlen(name);
	int idx = 0;
	while (s < end) {
		while (s < end && *s == ' ')
			s++;
		const char *t = s;
		while (s < end && *s != ' ')
			s++;
		if (s == t)
			break;
		if ((size_t)(s - t) == nl && memcmp(t, name, nl) == 0)
			return idx;
		idx++;
	}
	return -1;
}

/* The idx-th token of [s, end) as an unsigned decimal. */
static int token_u64(const char *s, const char *end, int idx, uint64_t *out)
{
	for (;;) {
		while (s < end && *s == ' ')
			s++;
		const char *t = s;
		while (s < end && *s != ' ')
			s++;
		if (s == t)
			return -1;
		if (idx-- == 0)
			return parse_dec(t, (size_t)(s - t), out) == (int)(s - t) ? 0 : -1;
	}
}

int snmp_counter(const char *text, const char *proto, const char *name, uint64_t *out)
{
	size_t pl = strlen(proto);
	for (const char *line = text; *line;) {
		const char *eol = strchr(line, '\n');
		const char *next = eol ? eol + 1 : line + strlen(line);
		if (strncmp(line, proto, pl) == 0 && line[pl] == ':') {
			/* The first "Tcp:" line names the columns, the second holds the values. */
			const char *veol = strchr(next, '\n');
			if (!eol || strncmp(next, proto, pl) != 0 || next[pl] != ':')
				return -1;
			int idx = token_index(line + pl + 1, eol, name);
			if (idx < 0)
				return -1;
			return token_u64(next + pl + 1, veol ? veol : next + strlen(next), idx, out);
		}
		line = next;
	}
	return -1;
}

/* ---------- buffers and sockets ---------- */

static uint64_t mono_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000ULL + (uint64_t)t.tv_nsec / 1000;
}

/* Advances the running clock by the time since the last call, at most STEP_MAX_US. */
static void clock_step(void)
{
	uint64_t m = mono_us(), d = m - S.last_mono;
	S.last_mono = m;
	if (d >= JUMP_LOG_US)
		logmsg("peer: %llu ms passed in one turn (VM paused or process starved): counted as %llu ms",
		       (unsigned long long)(d / 1000), STEP_MAX_US / 1000);
	if (d > STEP_MAX_US)
		d = STEP_MAX_US;
	S.run += d;
}

static int buf_reserve(struct buf *b, size_t want)
{
	if (want <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < want)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p)
		return -1;
	b->p = p;
	b->cap = cap;
	return 0;
}

static int buf_put(struct buf *b, const char *s, size_t n)
{
	if (buf_reserve(b, b->len + n) < 0)
		return -1;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	return 0;
}

static void buf_free(struct buf *b)
{
	free(b->p);
	*b = (struct buf){ NULL, 0, 0 };
}

/* Sends what it can of b; -1 when the connection is broken. */
static int flush_buf(int fd, struct buf *b)
{
	while (b->len) {
		ssize_t n = send(fd, b->p, b->len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return -1;
		memmove(b->p, b->p + n, b->len - (size_t)n);
		b->len -= (size_t)n;
	}
	return 0;
}

typedef void (*line_fn)(int who, char *line, size_t len);

/* Reads what fd has (a few reads at most, so one busy sender cannot starve the others) and
 * calls fn for each complete line. Returns -1 on end of file, error or an overlong line. */
static int read_lines(int fd, struct buf *b, line_fn fn, int who, int *got)
{
	for (int round = 0; round < 4; round++) {
		size_t want = b->len + 16384 < LINE_CAP ? b->len + 16384 : LINE_CAP;
		if (b->len == LINE_CAP || buf_reserve(b, want) < 0)
			return -1;
		ssize_t n = read(fd, b->p + b->len, want - b->len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return -1;
		*got = 1;
		size_t start = 0, end = b->len + (size_t)n;
		for (size_t i = b->len; i < end; i++) {
			if (b->p[i] != '\n')
				continue;
			size_t l = i - start;
			if (l && b->p[start + l - 1] == '\r')
				l--;
			b->p[start + l] = '\0';
			fn(who, b->p + start, l);
			start = i + 1;
		}
		memmove(b->p, b->p + start, end - start);
		b->len = end - start;
	}
	return 0;
}

/* ---------- reports ---------- */

static void jb_field(struct jbuf *b, const char *name, uint64_t v)
{
	jb_raw(b, ",\"");
	jb_raw(b, name);
	jb_raw(b, "\":");
	jb_u64(b, v);
}

static uint64_t retrans_now(void)
{
	char text[8192];
	uint64_t v;
	if (!S.has_retrans || read_small_file("/proc/net/snmp", text, sizeof(text)) < 0 ||
	    snmp_counter(text, "Tcp", "RetransSegs", &v) < 0)
		return 0;
	return v >= S.retrans_base ? v - S.retrans_base : 0;
}

/* The stats line ("\n"-terminated) into out; returns its length or -1. */
static int stats_line(char *out, size_t cap)
{
	struct jbuf b;
	int connected = 0;
	for (int i = 0; i < S.npeers; i++)
		connected += S.peers[i].st == C_UP;
	jb_init(&b, out, cap);
	jb_raw(&b, "{\"type\":\"peer\",\"peers\":");
	jb_u64(&b, (uint64_t)S.npeers);
	jb_field(&b, "connected", (uint64_t)connected);
	jb_field(&b, "hb_sent", S.hb_sent);
	jb_field(&b, "hb_acked", S.hb_acked);
	jb_field(&b, "hb_timeouts", S.hb_timeouts);
	jb_raw(&b, ",\"dead\":[");
	for (int i = 0, first = 1; i < S.npeers; i++) {
		if (!S.peers[i].dead)
			continue;
		if (!first)
			jb_raw(&b, ",");
		jb_str(&b, S.peers[i].name);
		first = 0;
	}
	jb_raw(&b, "]");
	jb_field(&b, "declared_dead", S.declared_dead);
	jb_field(&b, "req_sent", S.req_sent);
	jb_field(&b, "req_answered", S.req_answered);
	jb_field(&b, "req_bad", S.req_bad);
	jb_field(&b, "rtt_p50_us", io_percentile(S.rtt, S.nrtt, 50));
	jb_field(&b, "rtt_max_us", S.rtt_max);
	jb_field(&b, "retrans_segs", retrans_now());
	return jb_finish(&b);
}

/* One stats line to the host; the RTT window starts again. */
static void report(void)
{
	char line[STATS_LINE_MAX];
	if (stats_line(line, sizeof(line)) > 0)
		wl_send(S.ctx, line);
	S.nrtt = 0;
	S.rtt_max = 0;
	S.next_report = S.run + REPORT_US;
}

static void peer_event(struct peer *p, const char *what, uint64_t silent_us)
{
	char line[256];
	logmsg("peer: %s %s (silent %llu ms)", p->name, what, (unsigned long long)(silent_us / 1000));
	snprintf(line, sizeof(line), "{\"type\":\"peer_event\",\"event\":\"%s\",\"peer\":\"%s\",\"silent_ms\":%llu}\n",
		 what, p->name, (unsigned long long)(silent_us / 1000));
	wl_send(S.ctx, line);
	report();
}

/* ---------- queries from host clients ---------- */

static void query_finish(int slot)
{
	struct query *q = &S.queries[slot];
	char line[160];
	q->active = 0;
	if (q->client < 0)
		return; /* the client went away */
	snprintf(line, sizeof(line), "RESULT %s %d %llu\n", q->id, q->answered,
		 (unsigned long long)((S.run - q->start) / 1000));
	buf_put(&S.clients[q->client].out, line, strlen(line));
}

static void query_check(int slot)
{
	struct query *q = &S.queries[slot];
	if (q->active && q->answered >= q->expected)
		query_finish(slot);
}

/* The query a pending request belongs to, if it is still waiting. */
static struct query *query_of(const struct pending *e)
{
	if (e->query < 0 || !S.queries[e->query].active || S.queries[e->query].serial != e->qserial)
		return NULL;
	return &S.queries[e->query];
}

/* ---------- outgoing connections ---------- */

static struct pending *fifo_push(struct fifo *f)
{
	if (f->n == FIFO_LEN)
		return NULL;
	struct pending *e = &f->e[(f->head + f->n) % FIFO_LEN];
	f->n++;
	return e;
}

static struct pending *fifo_front(struct fifo *f)
{
	return f->n ? &f->e[f->head] : NULL;
}

static void fifo_pop(struct fifo *f)
{
	f->head = (f->head + 1) % FIFO_LEN;
	f->n--;
}

static int can_send(const struct peer *p)
{
	return p->st == C_UP && p->out.len < OUT_HIGH;
}

static void send_hb(struct peer *p)
{
	char line[32];
	if (!can_send(p))
		return;
	if (p->hb.n == FIFO_LEN) { /* unanswered for FIFO_LEN periods: surely timed out */
		if (!fifo_front(&p->hb)->timed_out)
			S.hb_timeouts++;
		fifo_pop(&p->hb);
	}
	struct pending *e = fifo_push(&p->hb);
	*e = (struct pending){ ++p->hb_seq, S.run, 0, -1, 0, 0 };
	snprintf(line, sizeof(line), "HB %llu\n", (unsigned long long)e->id);
	buf_put(&p->out, line, strlen(line));
	S.hb_sent++;
}

/* A payload the receiver cannot predict cheaply, in printable characters. */
static void make_payload(char *dst, size_t n, uint64_t id)
{
	static const char abc[] = "abcdefghijklmnopqrstuvwxyz0123456789";
	uint64_t r = 0;
	for (size_t i = 0; i < n; i++) {
		if (i % 8 == 0)
			r = splitmix64(id * 0x100000001ULL + i);
		dst[i] = abc[(r & 0xff) % 36];
		r >>= 8;
	}
}

/* Queues one request; returns -1 when the peer cannot take one now. */
static int send_req(struct peer *p, int query, uint32_t qserial)
{
	char head[32];
	size_t nb = S.cfg->peer_req_bytes;
	if (!can_send(p) || p->req.n == FIFO_LEN)
		return -1;
	uint64_t id = ++S.next_id;
	int hl = snprintf(head, sizeof(head), "REQ %llu ", (unsigned long long)id);
	if (buf_reserve(&p->out, p->out.len + (size_t)hl + nb + 1) < 0)
		return -1;
	char *payload = p->out.p + p->out.len + hl;
	memcpy(p->out.p + p->out.len, head, (size_t)hl);
	make_payload(payload, nb, id);
	payload[nb] = '\n';
	p->out.len += (size_t)hl + nb + 1;
	*fifo_push(&p->req) = (struct pending){ id, S.run, peer_checksum(payload, nb), query, qserial, 0 };
	S.req_sent++;
	return 0;
}

static void on_hback(struct peer *p, uint64_t seq)
{
	struct pending *e;
	/* Answers come in order on one connection: older entries were skipped by the peer. */
	while ((e = fifo_front(&p->hb)) && e->id != seq)
		fifo_pop(&p->hb);
	if (e) {
		fifo_pop(&p->hb);
		S.hb_acked++;
	}
}

static void on_rep(struct peer *p, uint64_t id, uint64_t sum)
{
	struct pending *e;
	while ((e = fifo_front(&p->req)) && e->id != id)
		fifo_pop(&p->req);
	if (!e)
		return;
	uint64_t rtt = S.run - e->sent;
	if (S.nrtt < RTT_SAMPLES)
		S.rtt[S.nrtt++] = rtt > UINT32_MAX ? UINT32_MAX : (uint32_t)rtt;
	if (rtt > S.rtt_max)
		S.rtt_max = rtt;
	S.req_answered++;
	if (sum != e->sum)
		S.req_bad++;
	struct query *q = query_of(e);
	if (q) {
		q->answered++;
		query_check((int)(q - S.queries));
	}
	fifo_pop(&p->req);
}

/* A line from a peer on our outgoing connection. */
static void peer_line(int who, char *line, size_t len)
{
	struct peer *p = &S.peers[who];
	uint64_t a, b;
	int n;
	if (len > 6 && memcmp(line, "HBACK ", 6) == 0 && parse_dec(line + 6, len - 6, &a) == (int)(len - 6)) {
		on_hback(p, a);
	} else if (len > 4 && memcmp(line, "REP ", 4) == 0 && (n = parse_dec(line + 4, len - 4, &a)) > 0 &&
		   len - 4 - (size_t)n == 17) {
		char *end;
		b = strtoull(line + 4 + n + 1, &end, 16);
		if (end == line + len)
			on_rep(p, a, b);
	}
}

static void peer_closed(struct peer *p, const char *why)
{
	if (p->st == C_UP)
		logmsg("peer: connection to %s lost (%s)", p->name, why);
	close(p->fd);
	p->fd = -1;
	p->st = C_IDLE;
	p->in.len = p->out.len = 0;
	/* Heartbeats that can no longer be answered count as timed out now. */
	for (; p->hb.n; fifo_pop(&p->hb))
		if (!fifo_front(&p->hb)->timed_out)
			S.hb_timeouts++;
	/* Queries stop waiting for answers that cannot come. */
	for (; p->req.n; fifo_pop(&p->req)) {
		struct query *q = query_of(fifo_front(&p->req));
		if (q) {
			q->expected--;
			query_check((int)(q - S.queries));
		}
	}
	p->retry_at = S.run + p->backoff;
	p->backoff = p->backoff * 2 < BACKOFF_MAX_US ? p->backoff * 2 : BACKOFF_MAX_US;
}

static void peer_up(struct peer *p)
{
	int one = 1;
	setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	p->st = C_UP;
	p->next_hb = S.run;
	p->next_req = S.run + (uint64_t)S.cfg->peer_req_ms * 1000;
	logmsg("peer: connected to %s", p->name);
}

static void peer_connect(struct peer *p)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_port = htons(p->addr.port);
	a.sin_addr.s_addr = htonl(p->addr.ip);
	p->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (p->fd < 0) {
		p->st = C_IDLE;
		p->retry_at = S.run + BACKOFF_MAX_US;
		return;
	}
	p->st = C_CONNECTING;
	p->connect_at = S.run;
	if (connect(p->fd, (struct sockaddr *)&a, sizeof(a)) == 0)
		peer_up(p);
	else if (errno != EINPROGRESS)
		peer_closed(p, strerror(errno));
}

/* poll said something about p's socket. */
static void peer_io(struct peer *p, short revents)
{
	if (p->st == C_CONNECTING) {
		int err = 0;
		socklen_t l = sizeof(err);
		if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
			err = errno;
		if (err)
			peer_closed(p, strerror(err));
		else if (revents & (POLLOUT | POLLIN))
			peer_up(p);
		return;
	}
	int got = 0;
	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		int rc = read_lines(p->fd, &p->in, peer_line, (int)(p - S.peers), &got);
		if (got) {
			/* Anything at all from the peer proves it runs. */
			if (p->dead) {
				p->dead = 0;
				peer_event(p, "alive", S.run - p->last_heard);
			}
			p->last_heard = S.run;
			p->heard = 1;
			p->backoff = BACKOFF_MIN_US;
		}
		if (rc < 0) {
			peer_closed(p, "closed by the peer");
			return;
		}
	}
	if (flush_buf(p->fd, &p->out) < 0)
		peer_closed(p, strerror(errno));
}

/* Timers of one peer: reconnect, connect timeout, heartbeat, request, timeouts, death. */
static void peer_timers(struct peer *p)
{
	const struct config *c = S.cfg;
	uint64_t connect_max = S.dead_us > 1000000 ? S.dead_us : 1000000;
	if (p->st == C_IDLE && S.run >= p->retry_at)
		peer_connect(p);
	if (p->st == C_CONNECTING && S.run - p->connect_at >= connect_max)
		peer_closed(p, "connect timed out");
	if (p->st == C_UP && S.run >= p->next_hb) {
		send_hb(p);
		p->next_hb += (uint64_t)c->peer_hb_ms * 1000;
		if (p->next_hb <= S.run) /* no burst after a long turn */
			p->next_hb = S.run + (uint64_t)c->peer_hb_ms * 1000;
	}
	if (p->st == C_UP && c->peer_req_ms && S.run >= p->next_req) {
		send_req(p, -1, 0);
		p->next_req += (uint64_t)c->peer_req_ms * 1000;
		if (p->next_req <= S.run)
			p->next_req = S.run + (uint64_t)c->peer_req_ms * 1000;
	}
	if (p->st == C_UP && p->out.len && flush_buf(p->fd, &p->out) < 0)
		peer_closed(p, strerror(errno));
	for (unsigned i = 0; i < p->hb.n; i++) {
		struct pending *e = &p->hb.e[(p->hb.head + i) % FIFO_LEN];
		if (S.run - e->sent < S.dead_us)
			break; /* sent in order: the rest are younger */
		if (!e->timed_out) {
			e->timed_out = 1;
			S.hb_timeouts++;
		}
	}
	if (p->heard && !p->dead && S.run - p->last_heard >= S.dead_us) {
		p->dead = 1;
		S.declared_dead++;
		peer_event(p, "dead", S.run - p->last_heard);
	}
}

/* ---------- incoming connections ---------- */

static void client_close(int ci)
{
	struct client *c = &S.clients[ci];
	close(c->fd);
	c->fd = -1;
	buf_free(&c->in);
	buf_free(&c->out);
	for (int i = 0; i < QUERY_MAX; i++)
		if (S.queries[i].active && S.queries[i].client == ci)
			S.queries[i].client = -1;
}

static void query_start(int ci, const char *id, size_t len)
{
	int slot = -1;
	for (int i = 0; i < QUERY_MAX && slot < 0; i++)
		if (!S.queries[i].active)
			slot = i;
	if (len == 0 || len > QUERY_ID_MAX || memchr(id, ' ', len) || slot < 0) {
		const char *e = slot < 0 ? "ERR too many queries\n" : "ERR usage: QUERY id (1-64 characters, no space)\n";
		buf_put(&S.clients[ci].out, e, strlen(e));
		return;
	}
	struct query *q = &S.queries[slot];
	*q = (struct query){ 1, ci, ++S.qserial, "", S.run, 0, 0 };
	memcpy(q->id, id, len);
	q->id[len] = '\0';
	for (int i = 0; i < S.npeers; i++)
		if (send_req(&S.peers[i], slot, q->serial) == 0)
			q->expected++;
	query_check(slot); /* no connected peer: answered at once */
}

static void client_line(int ci, char *line, size_t len)
{
	char out[STATS_LINE_MAX];
	if (len > 6 && memcmp(line, "QUERY ", 6) == 0) {
		query_start(ci, line + 6, len - 6);
		return;
	}
	if (len == 5 && memcmp(line, "STATS", 5) == 0) {
		if (stats_line(out, sizeof(out)) < 0)
			return;
	} else {
		peer_exec(line, len, out, sizeof(out));
	}
	buf_put(&S.clients[ci].out, out, strlen(out));
}

static void accept_client(void)
{
	int fd = accept4(S.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	int one = 1;
	if (fd < 0)
		return;
	for (int i = 0; i < CLIENT_MAX; i++) {
		if (S.clients[i].fd < 0) {
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			S.clients[i].fd = fd;
			return;
		}
	}
	static const char full[] = "ERR too many connections\n";
	if (send(fd, full, sizeof(full) - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* nothing more to tell it */
	}
	close(fd);
}

static void client_io(int ci, short revents)
{
	struct client *c = &S.clients[ci];
	int got = 0;
	if ((revents & (POLLIN | POLLHUP | POLLERR)) && read_lines(c->fd, &c->in, client_line, ci, &got) < 0) {
		flush_buf(c->fd, &c->out); /* a last answer to a client that closed its side */
		client_close(ci);
		return;
	}
	if (flush_buf(c->fd, &c->out) < 0)
		client_close(ci);
}

/* ---------- the loop ---------- */

static void setup(struct wl_ctx *ctx)
{
	const struct config *c = ctx->cfg;
	char text[8192];
	memset(&S, 0, sizeof(S));
	S.cfg = c;
	S.ctx = ctx;
	S.dead_us = (uint64_t)c->peer_dead_ms * 1000;
	S.last_mono = mono_us();
	S.npeers = c->npeers;
	for (int i = 0; i < S.npeers; i++) {
		struct peer *p = &S.peers[i];
		p->addr = c->peers[i];
		peer_addr_str(&p->addr, p->name, sizeof(p->name));
		p->fd = -1;
		p->backoff = BACKOFF_MIN_US;
	}
	for (int i = 0; i < CLIENT_MAX; i++)
		S.clients[i].fd = -1;
	S.has_retrans = read_small_file("/proc/net/snmp", text, sizeof(text)) > 0 &&
			snmp_counter(text, "Tcp", "RetransSegs", &S.retrans_base) == 0;
	S.next_report = REPORT_US;
}

/* Milliseconds poll may sleep: until the next heartbeat, request or reconnect, at most
 * POLL_MAX_MS (which also bounds how late silence and timeouts are noticed). */
static int poll_timeout(void)
{
	uint64_t next = S.run + POLL_MAX_MS * 1000ULL;
	for (int i = 0; i < S.npeers; i++) {
		const struct peer *p = &S.peers[i];
		if (p->st == C_IDLE && p->retry_at < next)
			next = p->retry_at;
		if (p->st == C_UP && p->next_hb < next)
			next = p->next_hb;
		if (p->st == C_UP && S.cfg->peer_req_ms && p->next_req < next)
			next = p->next_req;
	}
	return next > S.run ? (int)((next - S.run + 999) / 1000) : 0;
}

int wl_peer(struct wl_ctx *ctx)
{
	setup(ctx);
	S.lfd = listen_tcp(ctx->cfg->peer_port);
	if (S.lfd < 0)
		return 1;
	fcntl(S.lfd, F_SETFL, O_NONBLOCK);
	logmsg("peer: listening on port %d, %d peer(s), heartbeat %u ms, dead after %u ms", ctx->cfg->peer_port,
	       S.npeers, ctx->cfg->peer_hb_ms, ctx->cfg->peer_dead_ms);
	/* Ready once we serve: peers may boot later and are not waited for. */
	wl_ready(ctx);
	for (;;) {
		struct pollfd pf[1 + PEER_MAX + CLIENT_MAX];
		int who[1 + PEER_MAX + CLIENT_MAX], n = 0;
		pf[n] = (struct pollfd){ S.lfd, POLLIN, 0 };
		who[n++] = 0;
		for (int i = 0; i < S.npeers; i++) {
			struct peer *p = &S.peers[i];
			if (p->st == C_IDLE)
				continue;
			short ev = p->st == C_CONNECTING ? POLLOUT : (short)(POLLIN | (p->out.len ? POLLOUT : 0));
			pf[n] = (struct pollfd){ p->fd, ev, 0 };
			who[n++] = 1 + i;
		}
		for (int i = 0; i < CLIENT_MAX; i++) {
			struct client *c = &S.clients[i];
			if (c->fd < 0)
				continue;
			/* A client that does not read its answers is not read either. */
			short ev = (short)((c->out.len < OUT_HIGH ? POLLIN : 0) | (c->out.len ? POLLOUT : 0));
			pf[n] = (struct pollfd){ c->fd, ev, 0 };
			who[n++] = 1 + PEER_MAX + i;
		}
		int rc = poll(pf, (nfds_t)n, poll_timeout());
		clock_step();
		for (int j = 0; rc > 0 && j < n; j++) {
			if (!pf[j].revents)
				continue;
			if (who[j] == 0)
				accept_client();
			else if (who[j] <= PEER_MAX && S.peers[who[j] - 1].fd == pf[j].fd)
				peer_io(&S.peers[who[j] - 1], pf[j].revents);
			else if (who[j] > PEER_MAX && S.clients[who[j] - 1 - PEER_MAX].fd == pf[j].fd)
				client_io(who[j] - 1 - PEER_MAX, pf[j].revents);
		}
		/* Input first, then timers: a peer whose bytes were waiting is not declared dead. */
		for (int i = 0; i < S.npeers; i++)
			peer_timers(&S.peers[i]);
		for (int i = 0; i < QUERY_MAX; i++)
			if (S.queries[i].active && S.run - S.queries[i].start >= S.dead_us)
				query_finish(i);
		for (int i = 0; i < CLIENT_MAX; i++)
			if (S.clients[i].fd >= 0 && S.clients[i].out.len && flush_buf(S.clients[i].fd, &S.clients[i].out) < 0)
				client_close(i);
		if (S.run >= S.next_report)
			report();
	}
}
