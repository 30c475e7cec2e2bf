/*
 * wal2json format-version 2 rows into Arrow column buffers, in one pass over the bytes.
 *
 * The compiled half of loader/capture/wal2json_arrow.py (read_rows): a block of newline-terminated
 * rows in, the buffers of the columns of wal2json_arrow._row_schema() out, each value kept as the
 * exact text wal2json printed (a bare JSON number or boolean of a "value" key as its text, digits
 * and exponent as printed). Anything else (a key of another name, a value of another kind, a number
 * of no JSON form, a nested object, invalid UTF-8, a raw control character in a string, a lone
 * surrogate escape, a malformed row) returns None: the caller then decodes the block row by row,
 * which knows every case. Both give the same records (tests/capture/test_columnar_decode_unit.py).
 *
 * No allocation per row or value: every column is a growing buffer of offsets, bytes and validity
 * bits, turned into Python bytes at the end (one copy of a few megabytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Parse results: OK, or NOT_PLAIN (fall back), or NOMEM (raise). */
#define OK 0
#define NOT_PLAIN 1
#define NOMEM 2

typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static int buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(buf_t *b, const void *src, size_t n) {
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* A column of values: offsets (int32, strings only), bytes (strings) or int64s (xid), validity bits. */
typedef struct {
    buf_t offsets, data, valid;
    int64_t n, nulls;
} col_t;

static int col_init_offsets(col_t *c) {
    int32_t zero = 0;
    return buf_put(&c->offsets, &zero, sizeof zero);
}

/* The column helpers below return OK, NOMEM or NOT_PLAIN, as the parser does. */

static int col_valid_bit(col_t *c, int valid) {
    if ((c->n & 7) == 0) {
        char zero = 0;
        if (buf_put(&c->valid, &zero, 1)) return NOMEM;
    }
    if (valid)
        c->valid.p[c->n >> 3] |= (char)(1 << (c->n & 7));
    else
        c->nulls++;
    c->n++;
    return OK;
}

/* Ends a string value whose bytes were appended to c->data: 1 = a value, 0 = null. */
static int col_end_string(col_t *c, int valid) {
    if (c->data.len > INT32_MAX) return NOT_PLAIN; /* beyond 32-bit offsets: the caller falls back */
    int32_t end = (int32_t)c->data.len;
    if (buf_put(&c->offsets, &end, sizeof end)) return NOMEM;
    return col_valid_bit(c, valid);
}

static int col_put_int(col_t *c, int64_t v, int valid) {
    if (buf_put(&c->data, &v, sizeof v)) return NOMEM;
    return col_valid_bit(c, valid);
}

static void col_free(col_t *c) {
    free(c->offsets.p);
    free(c->data.p);
    free(c->valid.p);
}

/* A list<struct<name, type[, value]>> column. */
typedef struct {
    col_t list; /* offsets and validity of the lists */
    col_t name, type, value;
    int has_value;
} list_t;

enum { C_ACTION, C_TIMESTAMP, C_LSN, C_NEXTLSN, C_SCHEMA, C_TABLE, N_STR };
enum { L_COLUMNS, L_IDENTITY, L_PK, N_LIST };

/* Each row's shape: its action, schema, table, and the names and types of its columns, old-key
 * columns and key names, as exact bytes (each piece length-prefixed, a null marked apart), numbered
 * in order of first appearance. The spool of landing v3 splits rows into tables and shapes by these
 * numbers instead of comparing texts. */
typedef struct {
    uint64_t hash;
    size_t at, len; /* the key's bytes in the arena */
    int32_t code;   /* -1: an empty slot */
} slot_t;

typedef struct {
    slot_t *slots;
    size_t cap, used;
    buf_t arena, key;
    buf_t codes; /* int32 per row */
} shapes_t;

typedef struct {
    col_t str[N_STR];
    col_t xid;
    list_t list[N_LIST];
    int64_t rows;
    shapes_t shapes;
} out_t;

typedef struct {
    const unsigned char *p, *end;
} cur_t;

static inline void skip_ws(cur_t *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r')) c->p++;
}

static inline int expect(cur_t *c, unsigned char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static inline int is_delim(cur_t *c) {
    /* What may follow a bare value: whitespace, a comma, the end of the object or array. */
    if (c->p >= c->end) return 0;
    unsigned char ch = *c->p;
    return ch == ',' || ch == '}' || ch == ']' || ch == ' ' || ch == '\t' || ch == '\r';
}

static inline int literal(cur_t *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char ch = s[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= ch - '0';
        else if (ch >= 'a' && ch <= 'f')
            v |= ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F')
            v |= ch - 'A' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int put_utf8(buf_t *b, unsigned cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | (cp >> 6));
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(b, u, n) ? NOMEM : OK;
}

/* A JSON string at c->p (after its opening quote): its unescaped bytes appended to b. */
static int string_body(cur_t *c, buf_t *b) {
    for (;;) {
        const unsigned char *start = c->p;
        while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20) c->p++;
        if (c->p > start && buf_put(b, start, (size_t)(c->p - start))) return NOMEM;
        if (c->p >= c->end) return NOT_PLAIN;
        unsigned char ch = *c->p++;
        if (ch == '"') return OK;
        if (ch != '\\') return NOT_PLAIN; /* a raw control character */
        if (c->p >= c->end) return NOT_PLAIN;
        ch = *c->p++;
        char out;
        switch (ch) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (c->end - c->p < 4 || hex4(c->p, &cp)) return NOT_PLAIN;
                c->p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return NOT_PLAIN; /* a lone low surrogate */
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || hex4(c->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return NOT_PLAIN;
                    c->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                int r = put_utf8(b, cp);
                if (r) return r;
                continue;
            }
            default: return NOT_PLAIN;
        }
        if (buf_put(b, &out, 1)) return NOMEM;
    }
}

/* An object key (no escapes in the keys wal2json prints): its bytes in [*k, *k + *n). */
static int key(cur_t *c, const unsigned char **k, size_t *n) {
    if (!expect(c, '"')) return NOT_PLAIN;
    const unsigned char *start = c->p;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\') c->p++;
    if (c->p >= c->end || *c->p != '"') return NOT_PLAIN;
    *k = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return expect(c, ':') ? OK : NOT_PLAIN;
}

#define KEY_IS(k, n, lit) ((n) == sizeof(lit) - 1 && memcmp((k), (lit), sizeof(lit) - 1) == 0)

/* One member of an object: its key is [k, k + n), the cursor at its value. */
typedef int (*member_fn)(cur_t *c, const unsigned char *k, size_t n, void *ctx);

/* A JSON object: each member handed to ``member`` in order. */
static int object(cur_t *c, member_fn member, void *ctx) {
    if (!expect(c, '{')) return NOT_PLAIN;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return OK;
    }
    for (;;) {
        const unsigned char *k;
        size_t n;
        int r;
        if ((r = key(c, &k, &n))) return r;
        if ((r = member(c, k, n, ctx))) return r;
        if (expect(c, ',')) continue;
        if (expect(c, '}')) return OK;
        return NOT_PLAIN;
    }
}

/* A string or null into a string column. */
static int string_value(cur_t *c, col_t *col) {
    skip_ws(c);
    if (c->p < c->end && *c->p == '"') {
        c->p++;
        int r = string_body(c, &col->data);
        return r ? r : col_end_string(col, 1);
    }
    if (literal(c, "null", 4) && is_delim(c)) return col_end_string(col, 0);
    return NOT_PLAIN;
}

static inline int digits(cur_t *c) {
    const unsigned char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    return c->p > start;
}

/* A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (anything else, which wal2json
 * never prints, goes to the row decoder, which quarantines the row). */
static int number(cur_t *c) {
    if (c->p < c->end && *c->p == '-') c->p++;
    if (c->p >= c->end) return 0;
    if (*c->p == '0')
        c->p++;
    else if (!digits(c))
        return 0;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!digits(c)) return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        if (!digits(c)) return 0;
    }
    return 1;
}

/* A "value": a string, a bare number or boolean as its text, or null. */
static int any_value(cur_t *c, col_t *col) {
    skip_ws(c);
    if (c->p >= c->end) return NOT_PLAIN;
    unsigned char ch = *c->p;
    if (ch == '"' || ch == 'n') return string_value(c, col);
    const unsigned char *start = c->p;
    if (ch == 't' || ch == 'f') {
        if (!(literal(c, "true", 4) || literal(c, "false", 5)) || !is_delim(c)) return NOT_PLAIN;
    } else {
        if (!number(c) || !is_delim(c)) return NOT_PLAIN;
    }
    if (buf_put(&col->data, start, (size_t)(c->p - start))) return NOMEM;
    return col_end_string(col, 1);
}

/* One {"name":..,"type":..[,"value":..]} object of a list. */
typedef struct {
    list_t *l;
    int seen; /* bits: name, type, value */
} entry_t;

static int entry_member(cur_t *c, const unsigned char *k, size_t n, void *ctx) {
    entry_t *e = ctx;
    if (KEY_IS(k, n, "name") && !(e->seen & 1)) {
        e->seen |= 1;
        return string_value(c, &e->l->name);
    }
    if (KEY_IS(k, n, "type") && !(e->seen & 2)) {
        e->seen |= 2;
        return string_value(c, &e->l->type);
    }
    if (e->l->has_value && KEY_IS(k, n, "value") && !(e->seen & 4)) {
        e->seen |= 4;
        return any_value(c, &e->l->value);
    }
    return NOT_PLAIN; /* another key, or one seen twice */
}

static int entry(cur_t *c, list_t *l) {
    entry_t e = {l, 0};
    int r = object(c, entry_member, &e), seen = e.seen;
    if (r) return r;
    /* Keys left out read as null. */
    if (!(seen & 1) && (r = col_end_string(&l->name, 0))) return r;
    if (!(seen & 2) && (r = col_end_string(&l->type, 0))) return r;
    if (l->has_value && !(seen & 4) && (r = col_end_string(&l->value, 0))) return r;
    return OK;
}

static int end_list(list_t *l, int valid) {
    if (l->name.n > INT32_MAX) return NOT_PLAIN;
    int32_t end = (int32_t)l->name.n;
    if (buf_put(&l->list.offsets, &end, sizeof end)) return NOMEM;
    return col_valid_bit(&l->list, valid);
}

static int list_value(cur_t *c, list_t *l) {
    skip_ws(c);
    if (literal(c, "null", 4)) return is_delim(c) ? end_list(l, 0) : NOT_PLAIN;
    if (!expect(c, '[')) return NOT_PLAIN;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return end_list(l, 1);
    }
    for (;;) {
        int r = entry(c, l);
        if (r) return r;
        if (expect(c, ',')) continue;
        if (expect(c, ']')) break;
        return NOT_PLAIN;
    }
    return end_list(l, 1);
}

static int xid_value(cur_t *c, col_t *col) {
    skip_ws(c);
    if (literal(c, "null", 4)) return is_delim(c) ? col_put_int(col, 0, 0) : NOT_PLAIN;
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return NOT_PLAIN;
    if (*c->p == '0' && c->p + 1 < c->end && c->p[1] >= '0' && c->p[1] <= '9') return NOT_PLAIN; /* not JSON */
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        if (v > (uint64_t)(INT64_MAX / 10)) return NOT_PLAIN; /* beyond int64: not an xid */
        v = v * 10 + (uint64_t)(*c->p++ - '0');
    }
    if (v > (uint64_t)INT64_MAX || !is_delim(c)) return NOT_PLAIN;
    return col_put_int(col, neg ? -(int64_t)v : (int64_t)v, 1);
}

/* The row's keys: the string columns (in enum order), "xid", then the lists. */
#define N_KEYS (N_STR + 1 + N_LIST)
static const char *const KEYS[N_KEYS] = {"action", "timestamp", "lsn",     "nextlsn",  "schema",
                                         "table",  "xid",       "columns", "identity", "pk"};
static size_t KEY_LENGTHS[N_KEYS];

typedef struct {
    out_t *o;
    unsigned seen; /* bits: N_STR string columns, then xid, then the lists */
} row_t;

static int row_member(cur_t *c, const unsigned char *k, size_t n, void *ctx) {
    row_t *w = ctx;
    int which = -1;
    for (int i = 0; i < N_KEYS; i++)
        if (n == KEY_LENGTHS[i] && memcmp(k, KEYS[i], n) == 0) {
            which = i;
            break;
        }
    if (which < 0 || (w->seen & (1u << which))) return NOT_PLAIN;
    w->seen |= 1u << which;
    if (which < N_STR) return string_value(c, &w->o->str[which]);
    if (which == N_STR) return xid_value(c, &w->o->xid);
    return list_value(c, &w->o->list[which - N_STR - 1]);
}

/* Entry i of a string column into a shape key: its length and bytes, or a null mark. */
static int key_piece(buf_t *k, const col_t *c, int64_t i) {
    uint32_t len;
    if (!(c->valid.p[i >> 3] & (1 << (i & 7)))) {
        len = UINT32_MAX; /* null */
        return buf_put(k, &len, sizeof len);
    }
    const int32_t *off = (const int32_t *)c->offsets.p;
    len = (uint32_t)(off[i + 1] - off[i]);
    if (buf_put(k, &len, sizeof len)) return -1;
    return buf_put(k, c->data.p + off[i], len);
}

/* A row's list into a shape key: its length, then each entry's name and type (a key's names
 * only), or a null mark. */
static int key_list(buf_t *k, const list_t *l, int64_t row) {
    uint32_t count;
    if (!(l->list.valid.p[row >> 3] & (1 << (row & 7)))) {
        count = UINT32_MAX;
        return buf_put(k, &count, sizeof count);
    }
    const int32_t *off = (const int32_t *)l->list.offsets.p;
    count = (uint32_t)(off[row + 1] - off[row]);
    if (buf_put(k, &count, sizeof count)) return -1;
    for (int32_t e = off[row]; e < off[row + 1]; e++) {
        if (key_piece(k, &l->name, e)) return -1;
        if (l->has_value && key_piece(k, &l->type, e)) return -1;
    }
    return 0;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * UINT64_C(0x100000001b3);
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    return h ^ (h >> 32);
}

static int shapes_grow(shapes_t *t) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    slot_t *slots = malloc(cap * sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < cap; i++) slots[i].code = -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].code < 0) continue;
        size_t j = (size_t)t->slots[i].hash & (cap - 1);
        while (slots[j].code >= 0) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The shape number of the row just parsed (o->rows not yet counted). */
static int row_shape(out_t *o) {
    shapes_t *t = &o->shapes;
    int64_t row = o->rows;
    t->key.len = 0;
    if (key_piece(&t->key, &o->str[C_ACTION], row) || key_piece(&t->key, &o->str[C_SCHEMA], row) ||
        key_piece(&t->key, &o->str[C_TABLE], row))
        return NOMEM;
    for (int i = 0; i < N_LIST; i++)
        if (key_list(&t->key, &o->list[i], row)) return NOMEM;
    const unsigned char *k = (const unsigned char *)t->key.p;
    size_t n = t->key.len;
    uint64_t h = hash_bytes(k, n);
    if ((t->used + 1) * 2 > t->cap && shapes_grow(t)) return NOMEM;
    size_t j = (size_t)h & (t->cap - 1);
    int32_t code = -1;
    for (;; j = (j + 1) & (t->cap - 1)) {
        slot_t *sl = &t->slots[j];
        if (sl->code < 0) {
            if (t->used >= INT32_MAX) return NOT_PLAIN;
            sl->hash = h;
            sl->at = t->arena.len;
            sl->len = n;
            sl->code = code = (int32_t)t->used++;
            if (buf_put(&t->arena, k, n)) return NOMEM;
            break;
        }
        if (sl->hash == h && sl->len == n && memcmp(t->arena.p + sl->at, k, n) == 0) {
            code = sl->code;
            break;
        }
    }
    return buf_put(&t->codes, &code, sizeof code) ? NOMEM : OK;
}

/* One row: a JSON object on one line; c->end is the line's end. */
static int row(cur_t *c, out_t *o) {
    row_t w = {o, 0};
    int r = object(c, row_member, &w);
    unsigned seen = w.seen;
    if (r) return r;
    skip_ws(c);
    if (c->p != c->end) return NOT_PLAIN; /* something after the object */
    for (int i = 0; i < N_STR; i++)
        if (!(seen & (1u << i)) && (r = col_end_string(&o->str[i], 0))) return r;
    if (!(seen & (1u << N_STR)) && (r = col_put_int(&o->xid, 0, 0))) return r;
    for (int i = 0; i < N_LIST; i++)
        if (!(seen & (1u << (N_STR + 1 + i))) && (r = end_list(&o->list[i], 0))) return r;
    if ((r = row_shape(o))) return r;
    o->rows++;
    return OK;
}

/* Whether s[0..n) is UTF-8 (no overlongs, surrogates or code points beyond U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* Eight ASCII bytes at a time. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & UINT64_C(0x8080808080808080)) break;
            i += 8;
        }
        if (i >= n) break;
        unsigned char b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp;
        if (b >= 0xC2 && b <= 0xDF) {
            len = 2;
            cp = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            len = 3;
            cp = b & 0x0F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            len = 4;
            cp = b & 0x07;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += len;
    }
    return 1;
}

static PyObject *bytes_of(buf_t *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

/* (offsets, data, validity, null count) of a string column. */
static PyObject *str_tuple(col_t *c) {
    return Py_BuildValue("(NNNL)", bytes_of(&c->offsets), bytes_of(&c->data), bytes_of(&c->valid), (long long)c->nulls);
}

static PyObject *list_tuple(list_t *l) {
    PyObject *value = l->has_value ? str_tuple(&l->value) : Py_NewRef(Py_None);
    return Py_BuildValue("(NNLNNN)", bytes_of(&l->list.offsets), bytes_of(&l->list.valid), (long long)l->list.nulls,
                         str_tuple(&l->name), str_tuple(&l->type), value);
}

static void out_free(out_t *o) {
    for (int i = 0; i < N_STR; i++) col_free(&o->str[i]);
    col_free(&o->xid);
    for (int i = 0; i < N_LIST; i++) {
        col_free(&o->list[i].list);
        col_free(&o->list[i].name);
        col_free(&o->list[i].type);
        col_free(&o->list[i].value);
    }
    free(o->shapes.slots);
    free(o->shapes.arena.p);
    free(o->shapes.key.p);
    free(o->shapes.codes.p);
}

static int out_init(out_t *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_STR; i++)
        if (col_init_offsets(&o->str[i])) return -1;
    for (int i = 0; i < N_LIST; i++) {
        list_t *l = &o->list[i];
        l->has_value = i != L_PK;
        if (col_init_offsets(&l->list) || col_init_offsets(&l->name) || col_init_offsets(&l->type) ||
            col_init_offsets(&l->value))
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(parse_doc,
             "parse(data) -> tuple | None\n\n"
             "The newline-terminated wal2json format-version 2 rows of ``data`` as column buffers:\n"
             "(rows, xid, strings, lists, shapes), where xid is (int64 values, validity, null count), strings\n"
             "(action, timestamp, lsn, nextlsn, schema, table) each (int32 offsets, bytes, validity,\n"
             "null count) and lists (columns, identity, pk) each (offsets, validity, null count, name,\n"
             "type, value or None); validity is a bitmap (bit i of byte i // 8); shapes each row's shape\n"
             "number (int32: rows of equal action, schema, table, column names and types, old-key names and\n"
             "types and key names share one; numbered in order of first appearance). None when a row is not\n"
             "of the plain shape (see the file's comment).");

static PyObject *parse(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE)) return NULL;
    const unsigned char *s = view.buf, *end = s + view.len;
    out_t o;
    int r = OK;
    if (out_init(&o)) {
        r = NOMEM;
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (!valid_utf8(s, (size_t)view.len)) r = NOT_PLAIN;
    while (r == OK && s < end) {
        const unsigned char *nl = memchr(s, '\n', (size_t)(end - s));
        cur_t c = {s, nl ? nl : end};
        r = row(&c, &o);
        s = nl ? nl + 1 : end;
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&view);
    if (r == NOMEM) {
        out_free(&o);
        return PyErr_NoMemory();
    }
    if (r != OK || o.rows == 0) {
        out_free(&o);
        Py_RETURN_NONE;
    }
    PyObject *xid = Py_BuildValue("(NNL)", bytes_of(&o.xid.data), bytes_of(&o.xid.valid), (long long)o.xid.nulls);
    PyObject *strings = PyTuple_New(N_STR);
    PyObject *lists = PyTuple_New(N_LIST);
    if (strings)
        for (int i = 0; i < N_STR; i++) PyTuple_SET_ITEM(strings, i, str_tuple(&o.str[i]));
    if (lists)
        for (int i = 0; i < N_LIST; i++) PyTuple_SET_ITEM(lists, i, list_tuple(&o.list[i]));
    PyObject *shapes = bytes_of(&o.shapes.codes);
    int64_t rows = o.rows;
    out_free(&o);
    if (PyErr_Occurred()) {
        Py_XDECREF(xid);
        Py_XDECREF(strings);
        Py_XDECREF(lists);
        Py_XDECREF(shapes);
        return NULL;
    }
    return Py_BuildValue("(LNNNN)", (long long)rows, xid, strings, lists, shapes);
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_O, parse_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wal2json",
    "wal2json format-version 2 rows into Arrow column buffers (see loader/capture/wal2json_arrow.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__wal2json(void) {
    for (int i = 0; i < N_KEYS; i++) KEY_LENGTHS[i] = strlen(KEYS[i]);
    return PyModule_Create(&module);
}
