/* `kv` workload: a line protocol on TCP (SET k v / GET k / DEL k / COUNT), state only in
 * RAM, many clients through one poll loop. */
#include "agent.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CLIENTS 64
#define KV_LINE_MAX 4096
#define BUCKETS 4096

struct entry {
	struct entry *next;
	char *key;
	char *val;
};

struct client {
	int fd;
	size_t len;
	char buf[KV_LINE_MAX];
};

/* The table doubles when it holds more keys than buckets, so a lookup touches one or
 * two entries however many keys there are (a guest's working set is the keys its
 * clients use, not the whole store). */
static struct entry **table;
static uint64_t nbuckets;
static uint64_t count;

static uint64_t hash(const char *k)
{
	uint64_t h = 1469598103934665603ULL;
	for (; *k; k++)
		h = (h ^ (unsigned char)*k) * 1099511628211ULL;
	return h;
}

/* Makes room for `want` buckets (a power of two); keeps the old table when memory is
 * short (lookups only get longer). Returns -1 when there is no table at all. */
static int resize(uint64_t want)
{
	struct entry **t = calloc(want, sizeof(*t));
	if (!t)
		return table ? 0 : -1;
	for (uint64_t i = 0; i < nbuckets; i++) {
		struct entry *e = table[i];
		while (e) {
			struct entry *next = e->next;
			uint64_t b = hash(e->key) & (want - 1);
			e->next = t[b];
			t[b] = e;
			e = next;
		}
	}
	free(table);
	table = t;
	nbuckets = want;
	return 0;
}

static struct entry **find(const char *k)
{
	if (!table && resize(BUCKETS) < 0)
		return NULL;
	struct entry **e = &table[hash(k) & (nbuckets - 1)];
	while (*e && strcmp((*e)->key, k) != 0)
		e = &(*e)->next;
	return e;
}

/* Executes one command line; writes the reply (with '\n') into out. */
void kv_exec(char *line, char *out, size_t cap)
{
	char *cmd = line, *key = NULL, *val = NULL;
	char *sp = strchr(line, ' ');
	if (sp) {
		*sp = '\0';
		key = sp + 1;
		sp = strchr(key, ' ');
		if (sp) {
			*sp = '\0';
			val = sp + 1;
		}
	}
	if (strcmp(cmd, "SET") == 0 && key && *key && val) {
		if (count >= nbuckets && table)
			resize(nbuckets * 2);
		struct entry **e = find(key);
		char *v = e ? strdup(val) : NULL;
		if (!v) {
			snprintf(out, cap, "ERR out of memory\n");
			return;
		}
		if (*e) {
			free((*e)->val);
			(*e)->val = v;
		} else {
			struct entry *n = malloc(sizeof(*n));
			char *k = strdup(key);
			if (!n || !k) {
				free(n);
				free(k);
				free(v);
				snprintf(out, cap, "ERR out of memory\n");
				return;
			}
			*n = (struct entry){ NULL, k, v };
			*e = n;
			count++;
		}
		snprintf(out, cap, "OK\n");
	} else if (strcmp(cmd, "GET") == 0 && key && *key && !val) {
		struct entry **e = find(key);
		if (e && *e)
			snprintf(out, cap, "VALUE %s\n", (*e)->val);
		else
			snprintf(out, cap, "NOTFOUND\n");
	} else if (strcmp(cmd, "DEL") == 0 && key && *key && !val) {
		struct entry **e = find(key);
		if (e && *e) {
			struct entry *d = *e;
			*e = d->next;
			free(d->key);
			free(d->val);
			free(d);
			count--;
			snprintf(out, cap, "OK\n");
		} else {
			snprintf(out, cap, "NOTFOUND\n");
		}
	} else if (strcmp(cmd, "COUNT") == 0 && !key) {
		snprintf(out, cap, "COUNT %llu\n", (unsigned long long)count);
	} else {
		snprintf(out, cap, "ERR usage: SET k v | GET k | DEL k | COUNT\n");
	}
}

/* Returns -1 when the client must be closed. */
static int client_input(struct client *c)
{
	ssize_t n = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (n <= 0)
		return -1;
	size_t start = 0, end = c->len + (size_t)n;
	for (size_t i = c->len; i < end; i++) {
		if (c->buf[i] != '\n')
			continue;
		char out[KV_LINE_MAX + 16];
		size_t l = i - start;
		if (l && c->buf[start + l - 1] == '\r')
			l--;
		c->buf[start + l] = '\0';
		kv_exec(c->buf + start, out, sizeof(out));
		if (write_all(c->fd, out, strlen(out)) < 0)
			return -1;
		start = i + 1;
	}
	memmove(c->buf, c->buf + start, end - start);
	c->len = end - start;
	if (c->len == sizeof(c->buf)) {
		const char *e = "ERR line too long\n";
		write_all(c->fd, e, strlen(e));
		return -1;
	}
	return 0;
}

int wl_kv(struct wl_ctx *ctx, int port)
{
	static struct client clients[MAX_CLIENTS];
	int lfd = listen_tcp(port);
	if (lfd < 0)
		return 1;
	for (int i = 0; i < MAX_CLIENTS; i++)
		clients[i].fd = -1;
	logmsg("kv: listening on port %d", port);
	wl_disk_load(ctx);
	wl_ready(ctx);
	for (;;) {
		struct pollfd p[MAX_CLIENTS + 1];
		int idx[MAX_CLIENTS + 1], n = 0;
		p[n] = (struct pollfd){ lfd, POLLIN, 0 };
		idx[n++] = -1;
		for (int i = 0; i < MAX_CLIENTS; i++) {
			if (clients[i].fd >= 0) {
				p[n] = (struct pollfd){ clients[i].fd, POLLIN, 0 };
				idx[n++] = i;
			}
		}
		if (poll(p, (nfds_t)n, -1) < 0)
			continue;
		for (int j = 0; j < n; j++) {
			if (!p[j].revents)
				continue;
			if (idx[j] < 0) {
				int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
				int slot = -1;
				for (int i = 0; fd >= 0 && i < MAX_CLIENTS && slot < 0; i++)
					if (clients[i].fd < 0)
						slot = i;
				if (fd >= 0 && slot < 0) {
					const char *e = "ERR too many clients\n";
					write_all(fd, e, strlen(e));
					close(fd);
				} else if (fd >= 0) {
					clients[slot].fd = fd;
					clients[slot].len = 0;
				}
				continue;
			}
			struct client *c = &clients[idx[j]];
			if (client_input(c) < 0) {
				close(c->fd);
				c->fd = -1;
			}
		}
	}
}
