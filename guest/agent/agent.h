/* Shared declarations of the Rebound guest agent (protocol: docs/agent-protocol.md). */
#ifndef REBOUND_AGENT_H
#define REBOUND_AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define AGENT_VERSION 1
#define PORT_NAME "org.rebound.agent"
#define LINE_MAX_BYTES (64 * 1024)

/* ---- util.c ---- */
uint64_t splitmix64(uint64_t x);
int hex_nibble(char c); /* 0..15, or -1 if c is not a hex digit */
uint64_t now_ms(void); /* CLOCK_MONOTONIC */
uint64_t uptime_ms(void); /* CLOCK_BOOTTIME: time since the guest kernel started */
void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int write_all(int fd, const void *buf, size_t len);
/* Reads a small file into buf (NUL-terminated); returns bytes read or -1. */
ssize_t read_small_file(const char *path, char *buf, size_t cap);
/* 1 when no segment of the relative path p is empty, "." or "..". */
int path_segments_ok(const char *p);

/* ---- config.c: kernel command line ---- */
#define MAX_WORKLOADS 4
enum workload_kind { WL_WEB, WL_KV, WL_MEMFILL, WL_COUNTER, WL_IO, WL_PEER, WL_FLOOD };
#define IO_MAX_PHASES 8
#define FILES_MAX 100000 /* f00000..f99999 */
enum files_pattern { FP_SEQ, FP_RANDOM, FP_ZIPF, FP_CLASS };
#define PEER_MAX 16 /* rebound.peers entries */
#define PEER_REQ_BYTES_MAX 65536

/* One IP:PORT of rebound.peers (both in host byte order). */
struct peer_addr {
	uint32_t ip;
	uint16_t port;
};

struct config {
	char workload[64]; /* as given, e.g. "web" or "web,kv"; "none" when absent */
	int nworkloads;
	enum workload_kind workloads[MAX_WORKLOADS];
	uint64_t memfill_bytes;
	unsigned counter_hz;
	int port_override; /* 0: none */
	unsigned watchdog_s; /* watchdog timeout to set; 0: the driver's default */
	uint64_t disk_io_bytes; /* read from the data disk (O_DIRECT) before serving; 0: none */
	/* The io workload (wl_io.c). */
	char io_target[64]; /* the file or block device (default /data/io.bin) */
	char io_phases[IO_MAX_PHASES][16];
	int io_nphases;
	uint64_t io_size, io_bs;
	int io_direct;
	int io_keep; /* 1: a target already io_size long is used as is, not rewritten first */
	unsigned io_seconds, io_rounds; /* io_rounds 0: forever */
	unsigned io_delay_s; /* seconds between ready and the first phase */
	/* Its file-set mode (wl_files.c), on when io_files > 0. */
	unsigned io_files;
	uint64_t io_file_size;
	char io_dir[64]; /* under /data (default /data/files) */
	int io_pattern; /* enum files_pattern */
	double io_zipf; /* alpha */
	unsigned io_class_p, io_class_q; /* P% of the files get Q% of the requests */
	uint64_t io_seed;
	double io_write_ratio;
	/* Of the writes, the share that churn the file set (wl_files.c): one 64 KiB chunk
	 * overwritten, the file truncated and written back, or deleted and created anew. */
	double io_churn;
	unsigned io_requests; /* per round */
	/* The peer workload (wl_peer.c). */
	int peer_port; /* listens there for peers and host clients (default 7400) */
	int npeers;
	struct peer_addr peers[PEER_MAX]; /* connects to these */
	unsigned peer_hb_ms, peer_dead_ms, peer_req_ms; /* peer_req_ms 0: no periodic requests */
	unsigned peer_req_bytes;
};

/* Parses "64M", "1G", "4096", "512K" (binary units). Returns 0 or -1 (bad or > 1 TiB). */
int parse_size(const char *s, uint64_t *out);
/* Parses a plain decimal ("0.25", "1", "1.5": digits, at most one point, no sign or
 * exponent) within [lo, hi]. Returns 0 or -1. */
int parse_decimal(const char *s, double lo, double hi, double *out);
const char *files_pattern_name(int p);
/* Fills cfg from a kernel command line. Bad values are reported into err (one line) and
 * replaced by defaults, so the agent still comes up; returns the number of problems. */
int parse_cmdline(const char *cmdline, struct config *cfg, char *err, size_t errlen);
/* Parses rebound.peers ("IP:PORT,IP:PORT", may be empty) into out[cap]. Returns the
 * number of peers, or -1 with the reason in why (IPv4 dotted quads only, ports 1-65535,
 * no duplicates, at most cap entries). */
int parse_peers(const char *v, struct peer_addr *out, int cap, char *why, size_t whylen);
/* "a.b.c.d:port" (at most 21 characters plus the NUL). */
void peer_addr_str(const struct peer_addr *a, char *out, size_t cap);
int workload_port(const struct config *cfg, enum workload_kind k);
/* The service port reported in `ready`: the first workload that listens, else 0. */
int service_port(const struct config *cfg);

/* ---- sysinfo.c ---- */
struct sysinfo_facts {
	char kernel_release[65];
	uint64_t mem_total_kib;
	int has_vmcoreinfo;
	uint64_t vmcoreinfo_paddr;
	uint64_t vmcoreinfo_size;
	/* The eviction-notice ring of guest/evict (0 bytes: the module is not loaded). */
	uint64_t evict_ring_gpa;
	uint64_t evict_ring_bytes;
};
void sysinfo_collect(struct sysinfo_facts *f);
/* A module parameter's text ("123\n"): a decimal number. */
int parse_param_u64(const char *text, uint64_t *v);
int parse_vmcoreinfo(const char *text, uint64_t *paddr, uint64_t *size);
int parse_meminfo(const char *text, const char *field, uint64_t *kib);

/* ---- port.c: the virtio-serial channel ---- */
/* Finds /dev/vportNpM for PORT_NAME (creating the node if needed) and opens it
 * non-blocking. Returns the fd or -1. */
int port_open(void);

/* ---- marker.c ---- */
/* Writes bytes at the start of a fresh mlocked page; returns its guest physical address
 * through paddr. Returns 0 or -1 with a reason in err. */
int marker_place(const char *value_hex, uint64_t *paddr, size_t *len, char *err, size_t errlen);
int hex_decode(const char *hex, unsigned char *out, size_t cap, size_t *len);

/* ---- warm.c: warm reboot (cachelist before, prefetch after) ---- */
#define WARM_CHUNK_MAX 30000 /* list text per message: under 64 KiB once JSON-escaped */
#define WARM_PATH_MAX 1024
struct warm_counts {
	uint64_t files, pages, bytes, skipped, missing;
};
typedef void (*warm_emit_fn)(const char *text, size_t len, int last, void *arg);
/* Lists the cached pages of every file under /data, in chunks of at most
 * WARM_CHUNK_MAX bytes; the last call has last=1. Returns 0 or -1. */
int warm_cachelist(warm_emit_fn emit, void *arg, struct warm_counts *counts);
/* Reads the pages the list file names (run in a child: it takes a while). */
void warm_prefetch(const char *list_path, struct warm_counts *counts);
void warm_prefetch_at(const char *root, const char *list_path, struct warm_counts *counts);
int warm_path_ok(const char *p);
int warm_parse_ranges(const char *s, const char **rest, uint64_t (*out)[2], size_t cap);

/* ---- workloads: each runs in its own child process, talking back over a pipe ----
 * A line "READY" means the workload is serving; any other line is a JSON message for the
 * host, forwarded as is. */
struct wl_ctx {
	const struct config *cfg;
	int out_fd; /* non-blocking pipe to the agent */
};
void wl_send(struct wl_ctx *ctx, const char *line); /* drops the line if the pipe is full */
void wl_ready(struct wl_ctx *ctx);
/* Reads cfg->disk_io_bytes from the data disk with O_DIRECT (a disk-bound start). */
void wl_disk_load(struct wl_ctx *ctx);
int wl_web(struct wl_ctx *ctx, int port);
int wl_kv(struct wl_ctx *ctx, int port);
int wl_memfill(struct wl_ctx *ctx);
int wl_counter(struct wl_ctx *ctx);
int wl_io(struct wl_ctx *ctx);
int wl_files(struct wl_ctx *ctx); /* wl_io with rebound.io_files set */
int wl_peer(struct wl_ctx *ctx);
int wl_flood(struct wl_ctx *ctx);
/* The peer workload's stateless replies (HB, REQ, anything unknown), exposed for the unit
 * tests: writes the reply line into out and returns 0, or returns -1 for lines the caller
 * handles itself (QUERY, STATS). */
int peer_exec(const char *line, size_t len, char *out, size_t cap);
/* FNV-1a 64 of a request payload: what a REP carries. */
uint64_t peer_checksum(const char *p, size_t n);
/* Counter `name` of protocol `proto` ("Tcp") in /proc/net/snmp's text, found by the name
 * in the header line above its value line. Returns 0 or -1. */
int snmp_counter(const char *text, const char *proto, const char *name, uint64_t *out);
/* The io workload's block pattern and percentile, exposed for the unit tests. */
void io_fill(void *buf, size_t len, uint64_t offset, uint64_t version);
uint32_t io_percentile(uint32_t *v, size_t n, unsigned pct);
int listen_tcp(int port);
/* Pure parts of the workloads, exposed for the unit tests (test_agent.c). */
int web_target_to_path(const char *target, char *out, size_t cap);
void kv_exec(char *line, char *out, size_t cap);
uint64_t counter_checksum(const uint64_t *w, size_t n);
void counter_step(uint64_t *w, uint64_t seq); /* 0.0.0.0:port, SO_REUSEADDR; -1 on error */
const char *workload_name(enum workload_kind k);

/* ---- wl_files.c: the io workload's file-set mode, exposed for the unit tests ----
 * Block b (1 KiB) of file k at version v: word 0 = FILES_MAGIC << 48 | v, word j (1-127)
 * = splitmix64((k << 32) + b * 128 + j) ^ v. */
#define FILES_MAGIC 0x5242ULL
#define FILES_BLOCK 1024
#define FILES_VERSION_MASK ((1ULL << 48) - 1)
enum files_check { FC_OK, FC_STALE, FC_MISPLACED, FC_GARBAGE };
void files_fill_block(uint64_t *w, uint64_t file, uint64_t block, uint64_t version);
/* FC_OK when w is block `block` of `file` at `version`; else FC_STALE (a valid word 0 of
 * another version), FC_MISPLACED (word 0 right, the rest not this block's) or
 * FC_GARBAGE (word 0 no signature). *found gets word 0. */
enum files_check files_check_block(const uint64_t *w, uint64_t file, uint64_t block, uint64_t version,
				   uint64_t *found);
const char *files_check_name(enum files_check c);
/* Request n's k-th random number (k < 4): splitmix64(splitmix64(seed) ^ (4n + k)). */
uint64_t files_draw(uint64_t seed, uint64_t n, unsigned k);
struct files_sampler {
	int pattern;
	uint32_t n;
	uint64_t seed;
	uint32_t *perm; /* zipf: rank -> file; class: the hot files first */
	double *cdf; /* zipf: P(rank <= i) */
	uint32_t hot; /* class: how many files are hot */
	double hot_share, write_ratio, churn;
};
/* What a write request does to its file. */
enum files_op { FO_REWRITE, FO_CHUNK, FO_DIRECT, FO_TRUNCATE, FO_DELETE };
/* The write request n does (io_churn of them churn, evenly among the four kinds). */
enum files_op files_write_op(const struct files_sampler *s, uint64_t n);
/* Returns 0, or -1 when out of memory. */
int files_sampler_init(struct files_sampler *s, const struct config *cfg);
void files_sampler_free(struct files_sampler *s);
/* The file request n (0-based, counted across rounds) accesses; *write: 1 for a write. */
uint32_t files_pick(const struct files_sampler *s, uint64_t n, int *write);

#endif
