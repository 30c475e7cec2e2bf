/* The load's typing of PostgreSQL's date and timestamp texts in their plain form, in C.
 *
 * loader.load.values types a column of dates or timestamps by first asking, per value, whether its
 * text has the plain form (lake.types' DATE, TIMESTAMP_NTZ and UTC_TEXT regexes), then casting the
 * column with Arrow. The regex alone costs 50-70 ns a value, the cast as much again. This module
 * does both in one pass over the Arrow string array's buffers, about 10 ns a value: each text
 * that has the plain form AND names a real date and time is converted to the number the lake
 * stores (days since 1970-01-01, or microseconds since 1970-01-01 00:00 [UTC]); every other text
 * is marked "odd", and the Python code types it one by one exactly as before
 * (values.temporal_number: infinity, BC, long years, other offsets, or a misfit).
 *
 *   parse(offsets, data, offset, length, kind) -> (numbers: bytes of int64[length],
 *                                                  odd: bytes of uint8[length])
 *
 * offsets: the array's int32 offsets buffer, data: its character buffer, offset/length: the
 * array's slice. kind: 0 DATE, 1 TIMESTAMP_NTZ, 2 TIMESTAMP (the text must end in "+00").
 * Null slots are not looked at by the caller (their number is 0, their odd flag whatever).
 * Plain C against the Python headers, no Arrow headers: the buffers come in by the buffer protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

static PyObject *parse(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS, "Plain dates or timestamps of an Arrow string array: (numbers, odd)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_temporal", NULL, -1, methods};

PyMODINIT_FUNC PyInit__temporal(void) { return PyModule_Create(&module); }
