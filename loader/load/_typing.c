/* The load's typing of PostgreSQL's date, timestamp and numeric texts in their plain form, in C.
 *
 * loader.load.values types a column by first asking, per value, whether its text has the plain
 * form (lake.types' regexes, by RE2 or Arrow's ASCII classes), then casting the column with Arrow.
 * For dates and timestamps the regex alone costs 50-70 ns a value and the cast as much again; for
 * numerics the checks and the cast cost about 60 ns. This module does both in one pass over the
 * Arrow string array's buffers, about 10 ns a value.
 *
 *   temporal(offsets, data, offset, length, kind) -> (numbers: bytes of int64[length],
 *                                                     odd: bytes of uint8[length])
 *
 * Each text that has the plain form AND names a real date and time is converted to the number the
 * lake stores (days since 1970-01-01, or microseconds since 1970-01-01 00:00 [UTC]); every other
 * text is marked "odd", and the Python code types it one by one exactly as before
 * (values.temporal_number: infinity, BC, long years, other offsets, or a misfit). kind: 0 DATE,
 * 1 TIMESTAMP_NTZ, 2 TIMESTAMP (the text must end in "+00"). Null slots: the caller masks them.
 *
 *   decimal(offsets, data, offset, length, nulls, precision, scale) -> bytes of int128[length] | None
 *
 * Every non-null text in the plain form (-?[0-9]+(.[0-9]+)?) with at most ``scale`` fraction
 * digits and at most ``precision - scale`` integer digits (leading zeros aside): the unscaled
 * values Arrow's cast to decimal128(precision, scale) gives, little-endian; None as soon as one text
 * is anything else (the caller then runs the regex and Arrow's cast, which decide as before).
 * ``nulls``: one byte per slot (non-zero: NULL, its bytes not read), or empty when none is NULL.
 *
 *   json_objects(prefixes, columns, keyed, length) -> (validity, offsets, data) | None
 *
 * history's pg_old_key of ``length`` rows in one pass: each row whose ``keyed`` byte is non-zero
 * (every row when ``keyed`` is empty) becomes prefix[0] value[0] prefix[1] value[1] ... "}", where
 * the prefixes are JSON text the caller wrote (``{"id":``, ``,"k2":``) and each value is its
 * column's text as a JSON string literal, escaped as Spark's ``to_json`` (Jackson) escapes it
 * (loader.load.kernel.json_strings: '"' and '\\' and five control characters in short form, the
 * other control characters as \u00XX with upper-case hex, everything else as is), or ``null``;
 * the other rows are NULL. columns: per prefix, (offsets, data, offset, validity): a string
 * array's buffers, its slice offset and its validity bitmap (empty: no NULL). Returns an Arrow
 * string array's buffers (validity bitmap, int32 offsets, characters), or None when the characters
 * would pass int32 offsets.
 *
 * offsets: the array's int32 offsets buffer, data: its character buffer, offset/length: the
 * array's slice. Plain C against the Python headers, no Arrow headers: the buffers come in by the
 * buffer protocol, and every offset is checked against the data buffer before it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "decimal128 values are written as the machine's int128: little-endian only"
#endif

static int digits(const unsigned char *p, int n, int64_t *out) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        unsigned d = (unsigned)p[i] - '0';
        if (d > 9) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    /* H. Hinnant's algorithm, as values.days_from_civil (floor division for negative years). */
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int month_days(int64_t y, int64_t m) {
    if (m == 2) return (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)) ? 29 : 28;
    return (m == 4 || m == 6 || m == 9 || m == 11) ? 30 : 31;
}

/* One text: 1 and *out set when plain and valid, else 0. */
static int parse_one(const unsigned char *p, Py_ssize_t n, int kind, int64_t *out) {
    int64_t year, month, day, hour, minute, second, frac = 0;
    if (n < 10 || p[4] != '-' || p[7] != '-') return 0;
    if (!digits(p, 4, &year) || !digits(p + 5, 2, &month) || !digits(p + 8, 2, &day)) return 0;
    if (month < 1 || month > 12 || day < 1 || day > month_days(year, month)) return 0;
    int64_t days = days_from_civil(year, month, day);
    if (kind == 0) {
        if (n != 10) return 0;
        *out = days;
        return 1;
    }
    if (kind == 2) {
        if (n < 22 || p[n - 3] != '+' || p[n - 2] != '0' || p[n - 1] != '0') return 0;
        n -= 3;
    }
    if (n < 19 || p[10] != ' ' || p[13] != ':' || p[16] != ':') return 0;
    if (!digits(p + 11, 2, &hour) || !digits(p + 14, 2, &minute) || !digits(p + 17, 2, &second)) return 0;
    if (hour > 23 || minute > 59 || second > 59) return 0;
    if (n > 19) {
        Py_ssize_t k = n - 20; /* fraction digits */
        if (p[19] != '.' || k < 1 || k > 6 || !digits(p + 20, (int)k, &frac)) return 0;
        for (Py_ssize_t i = k; i < 6; i++) frac *= 10;
    }
    *out = days * 86400000000LL + ((hour * 60 + minute) * 60 + second) * 1000000LL + frac;
    return 1;
}

static PyObject *temporal(PyObject *self, PyObject *args) {
    Py_buffer offsets, data;
    Py_ssize_t offset, length;
    int kind;
    if (!PyArg_ParseTuple(args, "y*y*nni", &offsets, &data, &offset, &length, &kind)) return NULL;
    PyObject *numbers = NULL, *odd = NULL, *result = NULL;
    if (kind < 0 || kind > 2 || offset < 0 || length < 0 ||
        (size_t)offsets.len < (size_t)(offset + length + 1) * sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer shorter than the array");
        goto done;
    }
    const int32_t *off = (const int32_t *)offsets.buf + offset;
    const unsigned char *chars = (const unsigned char *)data.buf;
    numbers = PyBytes_FromStringAndSize(NULL, length * (Py_ssize_t)sizeof(int64_t));
    odd = PyBytes_FromStringAndSize(NULL, length);
    if (numbers == NULL || odd == NULL) goto done;
    int64_t *num = (int64_t *)PyBytes_AS_STRING(numbers);
    unsigned char *flag = (unsigned char *)PyBytes_AS_STRING(odd);
    int bad_offsets = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < length; i++) {
        int32_t a = off[i], b = off[i + 1];
        int64_t v = 0;
        if (a < 0 || b < a || (Py_ssize_t)b > data.len) {
            bad_offsets = 1;
            break;
        }
        int ok = parse_one(chars + a, b - a, kind, &v);
        num[i] = ok ? v : 0;
        flag[i] = !ok;
    }
    Py_END_ALLOW_THREADS
    if (bad_offsets) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data buffer");
        goto done;
    }
    result = PyTuple_Pack(2, numbers, odd);
done:
    Py_XDECREF(numbers);
    Py_XDECREF(odd);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

/* A pass's status: 0 go on (returns 0); 1 the answer is None; 2 offsets outside the data buffer
 * (ValueError set). For 1 and 2, *result is set (None or NULL) and 1 returned. */
static int stopped(int status, PyObject **result) {
    if (status == 2) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data buffer");
        *result = NULL;
        return 1;
    }
    if (status == 1) {
        Py_INCREF(Py_None);
        *result = Py_None;
        return 1;
    }
    return 0;
}

/* One plain numeric text as an unscaled integer of ``scale`` fraction digits: 1 and *out set, or 0.
 * Digits gather in 64 bits (at most 18 of them, the common case) before 128-bit arithmetic. */
static const uint64_t POW10[19] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
                                   100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL,
                                   1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
                                   1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL,
                                   1000000000000000000ULL};

static int decimal_one(const unsigned char *p, Py_ssize_t n, int precision, int scale, __int128 *out) {
    Py_ssize_t i = 0;
    int negative = 0, int_digits = 0, frac_digits = 0, pending = 0;
    uint64_t chunk = 0; /* the last ``pending`` digits, not yet in v */
    __int128 v = 0;
    if (n > 0 && p[0] == '-') {
        negative = 1;
        i = 1;
    }
    Py_ssize_t start = i;
    for (; i < n && (unsigned)p[i] - '0' <= 9; i++) {
        if (int_digits == 0 && p[i] == '0') continue; /* leading zeros count for nothing */
        if (++int_digits > precision - scale) return 0;
        chunk = chunk * 10 + (p[i] - '0');
        if (++pending == 18) {
            v = v * (__int128)POW10[18] + chunk;
            chunk = 0;
            pending = 0;
        }
    }
    if (i == start) return 0; /* no integer digit */
    if (i < n) {
        if (p[i] != '.') return 0;
        Py_ssize_t dot = ++i;
        for (; i < n && (unsigned)p[i] - '0' <= 9; i++) {
            if (++frac_digits > scale) return 0;
            chunk = chunk * 10 + (p[i] - '0');
            if (++pending == 18) {
                v = v * (__int128)POW10[18] + chunk;
                chunk = 0;
                pending = 0;
            }
        }
        if (i == dot || i < n) return 0; /* no fraction digit, or something after them */
    }
    v = v * (__int128)POW10[pending] + chunk;
    for (int k = scale - frac_digits; k > 0; k -= 18) v *= (__int128)POW10[k < 18 ? k : 18];
    *out = negative ? -v : v;
    return 1;
}

static PyObject *decimal(PyObject *self, PyObject *args) {
    Py_buffer offsets, data, nulls;
    Py_ssize_t offset, length;
    int precision, scale;
    if (!PyArg_ParseTuple(args, "y*y*nny*ii", &offsets, &data, &offset, &length, &nulls, &precision, &scale))
        return NULL;
    PyObject *numbers = NULL, *result = NULL;
    if (offset < 0 || length < 0 || precision < 1 || precision > 38 || scale < 0 || scale > precision ||
        (size_t)offsets.len < (size_t)(offset + length + 1) * sizeof(int32_t) ||
        (nulls.len != 0 && nulls.len < length)) {
        PyErr_SetString(PyExc_ValueError, "buffers shorter than the array, or no such decimal type");
        goto done;
    }
    const int32_t *off = (const int32_t *)offsets.buf + offset;
    const unsigned char *chars = (const unsigned char *)data.buf;
    const unsigned char *null = nulls.len ? (const unsigned char *)nulls.buf : NULL;
    numbers = PyBytes_FromStringAndSize(NULL, length * 16);
    if (numbers == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(numbers);
    int status = 0; /* 0 all plain, 1 one is not, 2 bad offsets */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < length; i++) {
        __int128 v = 0;
        if (null == NULL || !null[i]) {
            int32_t a = off[i], b = off[i + 1];
            if (a < 0 || b < a || (Py_ssize_t)b > data.len) {
                status = 2;
                break;
            }
            if (!decimal_one(chars + a, b - a, precision, scale, &v)) {
                status = 1;
                break;
            }
        }
        memcpy(out + i * 16, &v, 16); /* little-endian two's complement, as Arrow's decimal128 */
    }
    Py_END_ALLOW_THREADS
    if (stopped(status, &result)) goto done;
    result = numbers;
    numbers = NULL;
done:
    Py_XDECREF(numbers);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    PyBuffer_Release(&nulls);
    return result;
}

/* Bytes of text [p, p + n) escaped as a JSON string's body (json_strings' escapes). */
static Py_ssize_t escaped_length(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t out = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
            out += 1;
        else if (c < 0x20)
            out += 5;
    }
    return out;
}

static unsigned char *write_escaped(unsigned char *w, const unsigned char *p, Py_ssize_t n) {
    static const char HEX[] = "0123456789ABCDEF";
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = HEX[c >> 4];
            *w++ = HEX[c & 15];
        }
    }
    return w;
}

#define MAX_KEY_COLUMNS 64

static PyObject *json_objects(PyObject *self, PyObject *args) {
    PyObject *prefixes, *columns;
    Py_buffer keyed;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "O!O!y*n", &PyTuple_Type, &prefixes, &PyTuple_Type, &columns, &keyed, &length))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(prefixes), held = 0;
    Py_buffer offs[MAX_KEY_COLUMNS], datas[MAX_KEY_COLUMNS], valids[MAX_KEY_COLUMNS];
    Py_ssize_t starts[MAX_KEY_COLUMNS];
    const char *pre[MAX_KEY_COLUMNS];
    Py_ssize_t pre_len[MAX_KEY_COLUMNS];
    PyObject *validity = NULL, *offsets = NULL, *data = NULL, *result = NULL;
    if (k < 1 || k > MAX_KEY_COLUMNS || PyTuple_GET_SIZE(columns) != k || length < 0 ||
        (keyed.len != 0 && keyed.len < length)) {
        PyErr_SetString(PyExc_ValueError, "json_objects: 1 to 64 key columns, a prefix each, a keyed byte per row");
        goto done;
    }
    for (; held < k; held++) {
        PyObject *prefix = PyTuple_GET_ITEM(prefixes, held), *col = PyTuple_GET_ITEM(columns, held);
        if (!PyBytes_Check(prefix) || !PyTuple_Check(col)) {
            PyErr_SetString(PyExc_TypeError, "json_objects: prefixes are bytes, columns tuples");
            goto done;
        }
        pre[held] = PyBytes_AS_STRING(prefix);
        pre_len[held] = PyBytes_GET_SIZE(prefix);
        if (!PyArg_ParseTuple(col, "y*y*ny*", &offs[held], &datas[held], &starts[held], &valids[held])) goto done;
        if (starts[held] < 0 || (size_t)offs[held].len < (size_t)(starts[held] + length + 1) * sizeof(int32_t) ||
            (valids[held].len != 0 && valids[held].len * 8 < starts[held] + length)) {
            held++;
            PyErr_SetString(PyExc_ValueError, "json_objects: buffers shorter than the array");
            goto done;
        }
    }
    const unsigned char *key = keyed.len ? (const unsigned char *)keyed.buf : NULL;
    validity = PyBytes_FromStringAndSize(NULL, (length + 7) / 8);
    offsets = PyBytes_FromStringAndSize(NULL, (length + 1) * (Py_ssize_t)sizeof(int32_t));
    if (validity == NULL || offsets == NULL) goto done;
    unsigned char *valid = (unsigned char *)PyBytes_AS_STRING(validity);
    int32_t *off = (int32_t *)PyBytes_AS_STRING(offsets);
    memset(valid, 0, (length + 7) / 8);
    int status = 0; /* 1: too long for int32 offsets (None), 2: bad offsets; as decimal's */
    Py_ssize_t total = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < length && !status; i++) {
        off[i] = (int32_t)total;
        if (key != NULL && !key[i]) continue;
        valid[i >> 3] |= (unsigned char)(1u << (i & 7));
        Py_ssize_t size = 1; /* the closing brace */
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t at = starts[j] + i;
            size += pre_len[j];
            if (valids[j].len && !((((const unsigned char *)valids[j].buf)[at >> 3] >> (at & 7)) & 1)) {
                size += 4; /* null */
                continue;
            }
            const int32_t *o = (const int32_t *)offs[j].buf;
            int32_t a = o[at], b = o[at + 1];
            if (a < 0 || b < a || (Py_ssize_t)b > datas[j].len) {
                status = 2;
                break;
            }
            size += 2 + escaped_length((const unsigned char *)datas[j].buf + a, b - a);
        }
        total += size;
        if (total > INT32_MAX) status = 1;
    }
    if (!status) off[length] = (int32_t)total;
    Py_END_ALLOW_THREADS
    if (stopped(status, &result)) goto done;
    data = PyBytes_FromStringAndSize(NULL, total);
    if (data == NULL) goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < length; i++) {
        if (key != NULL && !key[i]) continue;
        for (Py_ssize_t j = 0; j < k; j++) {
            Py_ssize_t at = starts[j] + i;
            memcpy(w, pre[j], pre_len[j]);
            w += pre_len[j];
            if (valids[j].len && !((((const unsigned char *)valids[j].buf)[at >> 3] >> (at & 7)) & 1)) {
                memcpy(w, "null", 4);
                w += 4;
                continue;
            }
            const int32_t *o = (const int32_t *)offs[j].buf;
            *w++ = '"';
            w = write_escaped(w, (const unsigned char *)datas[j].buf + o[at], o[at + 1] - o[at]);
            *w++ = '"';
        }
        *w++ = '}';
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, validity, offsets, data);
done:
    Py_XDECREF(validity);
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    for (Py_ssize_t j = 0; j < held; j++) {
        PyBuffer_Release(&offs[j]);
        PyBuffer_Release(&datas[j]);
        PyBuffer_Release(&valids[j]);
    }
    PyBuffer_Release(&keyed);
    return result;
}

static PyMethodDef methods[] = {
    {"temporal", temporal, METH_VARARGS, "Plain dates or timestamps of an Arrow string array: (numbers, odd)."},
    {"decimal", decimal, METH_VARARGS, "Plain numerics of an Arrow string array as decimal128 bytes, or None."},
    {"json_objects", json_objects, METH_VARARGS, "history's pg_old_key texts in one pass: (validity, offsets, data)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_typing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__typing(void) { return PyModule_Create(&module); }
