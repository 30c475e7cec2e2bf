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
    if (status == 2) {
        PyErr_SetString(PyExc_ValueError, "offsets outside the data buffer");
        goto done;
    }
    if (status == 1) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    result = numbers;
    numbers = NULL;
done:
    Py_XDECREF(numbers);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    PyBuffer_Release(&nulls);
    return result;
}

static PyMethodDef methods[] = {
    {"temporal", temporal, METH_VARARGS, "Plain dates or timestamps of an Arrow string array: (numbers, odd)."},
    {"decimal", decimal, METH_VARARGS, "Plain numerics of an Arrow string array as decimal128 bytes, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_typing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__typing(void) { return PyModule_Create(&module); }
