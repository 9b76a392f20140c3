/* Strict recursive-descent JSON reader (RFC 8259 grammar) bounded by the line length and a
 * nesting limit, plus a small writer. Host input is untrusted: every path returns an error
 * instead of reading out of bounds. */
#include "json.h"
#include "agent.h"

#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 16

struct parser {
	const char *p;
	const char *end;
	char *err;
	size_t errlen;
	int depth;
};

/* Keeps only the first reason: it is the one closest to the problem. */
static int fail_at(struct parser *ps, const char *start, const char *what)
{
	if (ps->err[0] == '\0')
		snprintf(ps->err, ps->errlen, "%s at byte %zu", what, (size_t)(ps->p - start));
	return -1;
}

static void skip_ws(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n'))
		ps->p++;
}

static int read_hex4(struct parser *ps, unsigned *out)
{
	unsigned v = 0;
	if (ps->end - ps->p < 4)
		return -1;
	for (int i = 0; i < 4; i++) {
		int h = hex_nibble(ps->p[i]);
		if (h < 0)
			return -1;
		v = (v << 4) | (unsigned)h;
	}
	ps->p += 4;
	*out = v;
	return 0;
}

/* Appends one byte to dst if there is room (dst == NULL: discard). */
static int put(char *dst, size_t cap, size_t *n, char c)
{
	if (dst) {
		if (*n + 1 >= cap)
			return -1;
		dst[*n] = c;
	}
	(*n)++;
	return 0;
}

static int put_utf8(char *dst, size_t cap, size_t *n, unsigned cp)
{
	char tmp[4];
	int k;
	if (cp < 0x80) {
		tmp[0] = (char)cp;
		k = 1;
	} else if (cp < 0x800) {
		tmp[0] = (char)(0xC0 | (cp >> 6));
		tmp[1] = (char)(0x80 | (cp & 0x3F));
		k = 2;
	} else if (cp < 0x10000) {
		tmp[0] = (char)(0xE0 | (cp >> 12));
		tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		tmp[2] = (char)(0x80 | (cp & 0x3F));
		k = 3;
	} else {
		tmp[0] = (char)(0xF0 | (cp >> 18));
		tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
		tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
		tmp[3] = (char)(0x80 | (cp & 0x3F));
		k = 4;
	}
	for (int i = 0; i < k; i++)
		if (put(dst, cap, n, tmp[i]) < 0)
			return -1;
	return 0;
}

/* Parses a string at ps->p (which must be '"'). dst may be NULL to skip. */
static int parse_string(struct parser *ps, const char *start, char *dst, size_t cap)
{
	size_t n = 0;
	if (ps->p >= ps->end || *ps->p != '"')
		return fail_at(ps, start, "expected string");
	ps->p++;
	for (;;) {
		if (ps->p >= ps->end)
			return fail_at(ps, start, "unterminated string");
		unsigned char c = (unsigned char)*ps->p++;
		if (c == '"')
			break;
		if (c < 0x20)
			return fail_at(ps, start, "control character in string");
		if (c != '\\') {
			if (put(dst, cap, &n, (char)c) < 0)
				return fail_at(ps, start, "string too long");
			continue;
		}
		if (ps->p >= ps->end)
			return fail_at(ps, start, "unterminated escape");
		char e = *ps->p++;
		char lit;
		switch (e) {
		case '"': lit = '"'; break;
		case '\\': lit = '\\'; break;
		case '/': lit = '/'; break;
		case 'b': lit = '\b'; break;
		case 'f': lit = '\f'; break;
		case 'n': lit = '\n'; break;
		case 'r': lit = '\r'; break;
		case 't': lit = '\t'; break;
		case 'u': {
			unsigned cp;
			if (read_hex4(ps, &cp) < 0)
				return fail_at(ps, start, "bad \\u escape");
			if (cp >= 0xD800 && cp <= 0xDBFF) {
				unsigned lo;
				if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
					return fail_at(ps, start, "unpaired surrogate");
				ps->p += 2;
				if (read_hex4(ps, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
					return fail_at(ps, start, "unpaired surrogate");
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
				return fail_at(ps, start, "unpaired surrogate");
			}
			if (cp == 0)
				return fail_at(ps, start, "NUL in string");
			if (put_utf8(dst, cap, &n, cp) < 0)
				return fail_at(ps, start, "string too long");
			continue;
		}
		default:
			return fail_at(ps, start, "bad escape");
		}
		if (put(dst, cap, &n, lit) < 0)
			return fail_at(ps, start, "string too long");
	}
	if (dst)
		dst[n] = '\0';
	return 0;
}

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

/* Parses a number; *is_u64 tells whether it is a non-negative integer that fits in 64 bits. */
static int parse_number(struct parser *ps, const char *start, uint64_t *val, int *is_u64)
{
	int neg = 0, integral = 1, overflow = 0;
	uint64_t v = 0;
	if (ps->p < ps->end && *ps->p == '-') {
		neg = 1;
		ps->p++;
	}
	if (ps->p >= ps->end || !is_digit(*ps->p))
		return fail_at(ps, start, "bad number");
	if (*ps->p == '0') {
		ps->p++;
	} else {
		while (ps->p < ps->end && is_digit(*ps->p)) {
			unsigned d = (unsigned)(*ps->p - '0');
			if (v > (UINT64_MAX - d) / 10)
				overflow = 1;
			else
				v = v * 10 + d;
			ps->p++;
		}
	}
	if (ps->p < ps->end && *ps->p == '.') {
		integral = 0;
		ps->p++;
		if (ps->p >= ps->end || !is_digit(*ps->p))
			return fail_at(ps, start, "bad number");
		while (ps->p < ps->end && is_digit(*ps->p))
			ps->p++;
	}
	if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
		integral = 0;
		ps->p++;
		if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
			ps->p++;
		if (ps->p >= ps->end || !is_digit(*ps->p))
			return fail_at(ps, start, "bad number");
		while (ps->p < ps->end && is_digit(*ps->p))
			ps->p++;
	}
	*val = v;
	*is_u64 = !neg && integral && !overflow;
	return 0;
}

static int parse_literal(struct parser *ps, const char *start, const char *lit)
{
	size_t n = strlen(lit);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0)
		return fail_at(ps, start, "unexpected token");
	ps->p += n;
	return 0;
}

static int skip_value(struct parser *ps, const char *start);

static int skip_container(struct parser *ps, const char *start, char close, int is_object)
{
	if (++ps->depth > MAX_DEPTH)
		return fail_at(ps, start, "nesting too deep");
	ps->p++; /* opening bracket */
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == close) {
		ps->p++;
		ps->depth--;
		return 0;
	}
	for (;;) {
		skip_ws(ps);
		if (is_object) {
			if (parse_string(ps, start, NULL, 0) < 0)
				return -1;
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':')
				return fail_at(ps, start, "expected ':'");
			ps->p++;
			skip_ws(ps);
		}
		if (skip_value(ps, start) < 0)
			return -1;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return fail_at(ps, start, "unterminated container");
		if (*ps->p == ',') {
			ps->p++;
			continue;
		}
		if (*ps->p == close) {
			ps->p++;
			ps->depth--;
			return 0;
		}
		return fail_at(ps, start, "expected ',' or closing bracket");
	}
}

static int skip_value(struct parser *ps, const char *start)
{
	uint64_t v;
	int u;
	if (ps->p >= ps->end)
		return fail_at(ps, start, "missing value");
	switch (*ps->p) {
	case '"': return parse_string(ps, start, NULL, 0);
	case '{': return skip_container(ps, start, '}', 1);
	case '[': return skip_container(ps, start, ']', 0);
	case 't': return parse_literal(ps, start, "true");
	case 'f': return parse_literal(ps, start, "false");
	case 'n': return parse_literal(ps, start, "null");
	default: return parse_number(ps, start, &v, &u);
	}
}

int json_parse_cmd(const char *line, size_t len, struct host_cmd *out, char *err, size_t errlen)
{
	struct parser ps = { line, line + len, err, errlen, 0 };
	const char *start = line;
	memset(out, 0, sizeof(*out));
	if (errlen)
		err[0] = '\0';

	skip_ws(&ps);
	if (ps.p >= ps.end || *ps.p != '{')
		return fail_at(&ps, start, "expected a JSON object");
	ps.p++;
	ps.depth = 1;
	skip_ws(&ps);
	if (ps.p < ps.end && *ps.p == '}') {
		ps.p++;
	} else {
		for (;;) {
			char key[64];
			skip_ws(&ps);
			/* Long keys are not ours: skip them rather than failing. */
			const char *kstart = ps.p;
			if (parse_string(&ps, start, key, sizeof(key)) < 0) {
				ps.err[0] = '\0';
				ps.p = kstart;
				if (parse_string(&ps, start, NULL, 0) < 0)
					return -1;
				key[0] = '\0';
			}
			skip_ws(&ps);
			if (ps.p >= ps.end || *ps.p != ':')
				return fail_at(&ps, start, "expected ':'");
			ps.p++;
			skip_ws(&ps);
			if (strcmp(key, "cmd") == 0) {
				if (out->has_cmd)
					return fail_at(&ps, start, "duplicate key \"cmd\"");
				if (ps.p >= ps.end || *ps.p != '"')
					return fail_at(&ps, start, "\"cmd\" must be a string");
				if (parse_string(&ps, start, out->cmd, sizeof(out->cmd)) < 0)
					return -1;
				out->has_cmd = 1;
			} else if (strcmp(key, "id") == 0) {
				int is_u64 = 0;
				if (out->has_id)
					return fail_at(&ps, start, "duplicate key \"id\"");
				if (ps.p >= ps.end || !(is_digit(*ps.p) || *ps.p == '-'))
					return fail_at(&ps, start, "\"id\" must be a number");
				if (parse_number(&ps, start, &out->id, &is_u64) < 0)
					return -1;
				if (!is_u64)
					return fail_at(&ps, start, "\"id\" must be a non-negative 64-bit integer");
				out->has_id = 1;
			} else if (strcmp(key, "last") == 0) {
				int is_u64 = 0;
				if (out->has_last)
					return fail_at(&ps, start, "duplicate key \"last\"");
				if (ps.p >= ps.end || !is_digit(*ps.p))
					return fail_at(&ps, start, "\"last\" must be 0 or 1");
				if (parse_number(&ps, start, &out->last, &is_u64) < 0)
					return -1;
				if (!is_u64 || out->last > 1)
					return fail_at(&ps, start, "\"last\" must be 0 or 1");
				out->has_last = 1;
			} else if (strcmp(key, "files") == 0) {
				if (out->has_files)
					return fail_at(&ps, start, "duplicate key \"files\"");
				if (ps.p >= ps.end || *ps.p != '"')
					return fail_at(&ps, start, "\"files\" must be a string");
				if (parse_string(&ps, start, out->files, sizeof(out->files)) < 0)
					return -1;
				out->has_files = 1;
			} else if (strcmp(key, "value_hex") == 0) {
				if (out->has_value_hex)
					return fail_at(&ps, start, "duplicate key \"value_hex\"");
				if (ps.p >= ps.end || *ps.p != '"')
					return fail_at(&ps, start, "\"value_hex\" must be a string");
				if (parse_string(&ps, start, out->value_hex, sizeof(out->value_hex)) < 0)
					return -1;
				out->has_value_hex = 1;
			} else if (skip_value(&ps, start) < 0) {
				return -1;
			}
			skip_ws(&ps);
			if (ps.p >= ps.end)
				return fail_at(&ps, start, "unterminated object");
			if (*ps.p == ',') {
				ps.p++;
				continue;
			}
			if (*ps.p == '}') {
				ps.p++;
				break;
			}
			return fail_at(&ps, start, "expected ',' or '}'");
		}
	}
	skip_ws(&ps);
	if (ps.p != ps.end)
		return fail_at(&ps, start, "trailing data after object");
	return 0;
}

void jb_init(struct jbuf *b, char *buf, size_t cap)
{
	b->buf = buf;
	b->cap = cap;
	b->len = 0;
	b->overflow = 0;
	if (cap)
		buf[0] = '\0';
}

static void jb_putc(struct jbuf *b, char c)
{
	if (b->overflow || b->len + 1 >= b->cap) {
		b->overflow = 1;
		return;
	}
	b->buf[b->len++] = c;
	b->buf[b->len] = '\0';
}

void jb_raw(struct jbuf *b, const char *s)
{
	while (*s)
		jb_putc(b, *s++);
}

void jb_str(struct jbuf *b, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	jb_putc(b, '"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			jb_putc(b, '\\');
			jb_putc(b, (char)c);
		} else if (c == '\n') {
			jb_raw(b, "\\n");
		} else if (c < 0x20 || c == 0x7f) {
			jb_raw(b, "\\u00");
			jb_putc(b, hex[c >> 4]);
			jb_putc(b, hex[c & 15]);
		} else if (c >= 0x80) {
			/* Our strings are ASCII; anything else (e.g. an echoed host byte) is escaped
			 * as its Latin-1 code point so the line stays valid UTF-8. */
			jb_raw(b, "\\u00");
			jb_putc(b, hex[c >> 4]);
			jb_putc(b, hex[c & 15]);
		} else {
			jb_putc(b, (char)c);
		}
	}
	jb_putc(b, '"');
}

void jb_u64(struct jbuf *b, uint64_t v)
{
	char tmp[24];
	snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v);
	jb_raw(b, tmp);
}

int jb_finish(struct jbuf *b)
{
	jb_raw(b, "}\n");
	return b->overflow ? -1 : (int)b->len;
}
