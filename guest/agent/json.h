/* Tiny JSON support for the agent: a strict reader for the host's one-line commands
 * and an append-only writer for our messages. Nothing here allocates. */
#ifndef REBOUND_JSON_H
#define REBOUND_JSON_H

#include <stddef.h>
#include <stdint.h>

#define CMD_NAME_MAX 32
#define MARKER_MAX_BYTES 4096
#define CMD_TEXT_MAX (64 * 1024)

/* The fields of a host command we understand; unknown keys are skipped (forward compatible). */
struct host_cmd {
	char cmd[CMD_NAME_MAX + 1];
	int has_cmd;
	uint64_t id;
	int has_id;
	char value_hex[2 * MARKER_MAX_BYTES + 1];
	int has_value_hex;
	uint64_t last; /* prefetch: 1 on the last chunk */
	int has_last;
	char files[CMD_TEXT_MAX]; /* prefetch: lines "START+COUNT,... PATH" */
	int has_files;
};

/* Parses one line (without the '\n'). Returns 0 on success; on failure returns -1 and
 * writes a one-line reason into err. Never reads past line[len]. */
int json_parse_cmd(const char *line, size_t len, struct host_cmd *out, char *err, size_t errlen);

/* Bounded output buffer; once it overflows, `overflow` is set and further appends are ignored. */
struct jbuf {
	char *buf;
	size_t cap;
	size_t len;
	int overflow;
};

void jb_init(struct jbuf *b, char *buf, size_t cap);
void jb_raw(struct jbuf *b, const char *s);
void jb_str(struct jbuf *b, const char *s); /* quoted, escaped */
void jb_u64(struct jbuf *b, uint64_t v);
/* Ends the object with "}\n"; returns the length, or -1 if it did not fit. */
int jb_finish(struct jbuf *b);

#endif
