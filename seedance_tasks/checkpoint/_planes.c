/* Byte planes of a checkpoint chunk: splitting elements into planes and putting them back, with
 * a chain of plane-wise deltas (XOR, bytewise add) applied on the way, in one pass.
 *
 * numpy does each of these as one strided pass per plane plus one whole-chunk pass per delta
 * level, each through memory; here the work is done in blocks of BLOCK elements that stay in the
 * second-level cache: the chain's planes are combined into a small buffer, which is then
 * interleaved into the output (and the other way round for a save). The loops have a constant
 * width, so the compiler vectorizes them (an AVX2 clone is chosen at run time where the CPU has
 * it). tests/checkpoint/test_planes.py compares every byte with the numpy code in codecs.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

#define BLOCK 16384  /* elements a block: the work buffer (width * BLOCK bytes) stays in L2 */
#define MAX_WIDTH 16 /* complex128 */
#define MAX_LEVELS 64

/* out[i * width + k] = planes[k][i] for i < n, with `width` a compile-time constant in the callers */
static inline void
interleave(uint8_t *restrict out, const uint8_t *const *planes, Py_ssize_t n, int width) {
    for (int k = 0; k < width; k++) {
        const uint8_t *restrict plane = planes[k];
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i * width + k] = plane[i];
        }
    }
}

/* Unrolled where gcc vectorizes the unrolled form 3-4x better than the loop above (interleaving
 * 2, 4 and 8 planes, splitting into 4); for splitting into 2 or 8 planes the loop is as fast or faster. */
static inline void
interleave4(uint8_t *restrict out, const uint8_t *const *planes, Py_ssize_t n) {
    const uint8_t *restrict p0 = planes[0], *restrict p1 = planes[1], *restrict p2 = planes[2],
                            *restrict p3 = planes[3];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[4 * i] = p0[i];
        out[4 * i + 1] = p1[i];
        out[4 * i + 2] = p2[i];
        out[4 * i + 3] = p3[i];
    }
}

static inline void
interleave2(uint8_t *restrict out, const uint8_t *const *planes, Py_ssize_t n) {
    const uint8_t *restrict p0 = planes[0], *restrict p1 = planes[1];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = p0[i];
        out[2 * i + 1] = p1[i];
    }
}

static inline void
interleave8(uint8_t *restrict out, const uint8_t *const *planes, Py_ssize_t n) {
    const uint8_t *restrict p0 = planes[0], *restrict p1 = planes[1], *restrict p2 = planes[2],
                            *restrict p3 = planes[3], *restrict p4 = planes[4], *restrict p5 = planes[5],
                            *restrict p6 = planes[6], *restrict p7 = planes[7];
    for (Py_ssize_t i = 0; i < n; i++) {
        out[8 * i] = p0[i];
        out[8 * i + 1] = p1[i];
        out[8 * i + 2] = p2[i];
        out[8 * i + 3] = p3[i];
        out[8 * i + 4] = p4[i];
        out[8 * i + 5] = p5[i];
        out[8 * i + 6] = p6[i];
        out[8 * i + 7] = p7[i];
    }
}

static inline void
deinterleave(uint8_t *const *planes, const uint8_t *restrict src, Py_ssize_t n, int width) {
    for (int k = 0; k < width; k++) {
        uint8_t *restrict plane = planes[k];
        for (Py_ssize_t i = 0; i < n; i++) {
            plane[i] = src[i * width + k];
        }
    }
}

static inline void
deinterleave4(uint8_t *const *planes, const uint8_t *restrict src, Py_ssize_t n) {
    uint8_t *restrict p0 = planes[0], *restrict p1 = planes[1], *restrict p2 = planes[2], *restrict p3 = planes[3];
    for (Py_ssize_t i = 0; i < n; i++) {
        p0[i] = src[4 * i];
        p1[i] = src[4 * i + 1];
        p2[i] = src[4 * i + 2];
        p3[i] = src[4 * i + 3];
    }
}

static inline void
put_block(uint8_t *out, const uint8_t *const *planes, Py_ssize_t n, int width) {
    switch (width) {
    case 2: interleave2(out, planes, n); break;
    case 4: interleave4(out, planes, n); break;
    case 1: memcpy(out, planes[0], (size_t)n); break;
    case 8: interleave8(out, planes, n); break;
    default: interleave(out, planes, n, width);
    }
}

static inline void
take_block(uint8_t *const *planes, const uint8_t *src, Py_ssize_t n, int width) {
    switch (width) {
    case 2: deinterleave(planes, src, n, 2); break; /* a constant width: the loop is vectorized */
    case 4: deinterleave4(planes, src, n); break;
    case 8: deinterleave(planes, src, n, 8); break;
    case 1: memcpy(planes[0], src, (size_t)n); break;
    default: deinterleave(planes, src, n, width);
    }
}

/* level 0's planes, then each further level applied with its op ('x' XOR, 'a' add mod 256), interleaved */
MULTIVERSION static void
merge(uint8_t *out, const uint8_t *const *levels, const char *ops, int count, Py_ssize_t n, int width,
      uint8_t *work) {
    const uint8_t *rows[MAX_WIDTH];
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t len = n - start < BLOCK ? n - start : BLOCK;
        for (int k = 0; k < width; k++) {
            rows[k] = levels[k] + start;
        }
        if (count > 1) {
            for (int k = 0; k < width; k++) {
                uint8_t *restrict acc = work + (size_t)k * BLOCK;
                const uint8_t *restrict first = levels[k] + start;
                const uint8_t *restrict second = levels[width + k] + start;
                if (ops[0] == 'x') {
                    for (Py_ssize_t i = 0; i < len; i++) acc[i] = first[i] ^ second[i];
                } else {
                    for (Py_ssize_t i = 0; i < len; i++) acc[i] = (uint8_t)(first[i] + second[i]);
                }
                for (int level = 2; level < count; level++) {
                    const uint8_t *restrict next = levels[level * width + k] + start;
                    if (ops[level - 1] == 'x') {
                        for (Py_ssize_t i = 0; i < len; i++) acc[i] ^= next[i];
                    } else {
                        for (Py_ssize_t i = 0; i < len; i++) acc[i] = (uint8_t)(acc[i] + next[i]);
                    }
                }
                rows[k] = acc;
            }
        }
        put_block(out + start * width, rows, len, width);
    }
}

/* planes[k][i] = byte k of element i of (src op base), op 'x' XOR, 's' subtract mod 256, or none */
MULTIVERSION static void
split(uint8_t *const *planes, const uint8_t *src, const uint8_t *base, char op, Py_ssize_t n, int width,
      uint8_t *work) {
    uint8_t *rows[MAX_WIDTH];
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t len = n - start < BLOCK ? n - start : BLOCK;
        const uint8_t *restrict from = src + start * width;
        if (base) {
            const uint8_t *restrict other = base + start * width;
            Py_ssize_t bytes = len * width;
            if (op == 'x') {
                for (Py_ssize_t i = 0; i < bytes; i++) work[i] = from[i] ^ other[i];
            } else {
                for (Py_ssize_t i = 0; i < bytes; i++) work[i] = (uint8_t)(from[i] - other[i]);
            }
            from = work;
        }
        for (int k = 0; k < width; k++) {
            rows[k] = planes[k] + start;
        }
        take_block(rows, from, len, width);
    }
}

/* Fills views[] with `width` buffers from the sequence `seq`, each at least `n` bytes (writable if asked). */
static int
plane_buffers(PyObject *seq, Py_buffer *views, int width, Py_ssize_t n, int writable, const char *what) {
    PyObject *fast = PySequence_Fast(seq, "planes must be a sequence of buffers");
    if (!fast) {
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(fast) != width) {
        PyErr_Format(PyExc_ValueError, "%s has %zd planes, not %d", what, PySequence_Fast_GET_SIZE(fast), width);
        Py_DECREF(fast);
        return -1;
    }
    for (int k = 0; k < width; k++) {
        int flags = writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, k), &views[k], flags) < 0) {
            for (int j = 0; j < k; j++) PyBuffer_Release(&views[j]);
            Py_DECREF(fast);
            return -1;
        }
        if (views[k].len != n) {
            PyErr_Format(PyExc_ValueError, "%s: plane %d holds %zd bytes, not %zd", what, k, views[k].len, n);
            for (int j = 0; j <= k; j++) PyBuffer_Release(&views[j]);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *
py_merge(PyObject *self, PyObject *args) {
    Py_buffer out;
    PyObject *levels_arg;
    const char *ops;
    Py_ssize_t ops_len;
    int width;
    if (!PyArg_ParseTuple(args, "w*Os#i", &out, &levels_arg, &ops, &ops_len, &width)) {
        return NULL;
    }
    PyObject *result = NULL, *levels = NULL;
    Py_buffer views[MAX_LEVELS * MAX_WIDTH];
    const uint8_t *pointers[MAX_LEVELS * MAX_WIDTH];
    int held = 0, count = 0;
    if (width < 1 || width > MAX_WIDTH || out.len % width) {
        PyErr_SetString(PyExc_ValueError, "width must be 1..16 and divide the output's length");
        goto done;
    }
    levels = PySequence_Fast(levels_arg, "levels must be a sequence of plane sequences");
    if (!levels) {
        goto done;
    }
    count = (int)PySequence_Fast_GET_SIZE(levels);
    if (count < 1 || count > MAX_LEVELS || ops_len != count - 1) {
        PyErr_SetString(PyExc_ValueError, "1..64 levels and one op for each level after the first");
        goto done;
    }
    for (Py_ssize_t i = 0; i < ops_len; i++) {
        if (ops[i] != 'x' && ops[i] != 'a') {
            PyErr_SetString(PyExc_ValueError, "ops are 'x' (XOR) or 'a' (add)");
            goto done;
        }
    }
    for (int level = 0; level < count; level++) {
        if (plane_buffers(PySequence_Fast_GET_ITEM(levels, level), views + held, width, out.len / width, 0,
                          "a level") < 0) {
            goto done;
        }
        held += width;
    }
    for (int i = 0; i < held; i++) {
        pointers[i] = views[i].buf;
    }
    uint8_t *work = count > 1 ? PyMem_RawMalloc((size_t)width * BLOCK) : NULL;
    if (count > 1 && !work) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    merge(out.buf, pointers, ops, count, out.len / width, width, work);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(work);
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    Py_XDECREF(levels);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *
py_split(PyObject *self, PyObject *args) {
    Py_buffer src, base = {0};
    PyObject *planes_arg, *base_arg = Py_None;
    const char *op = "";
    int width;
    if (!PyArg_ParseTuple(args, "y*iO|Os", &src, &width, &planes_arg, &base_arg, &op)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer views[MAX_WIDTH];
    uint8_t *pointers[MAX_WIDTH];
    int held = 0, have_base = 0;
    if (width < 1 || width > MAX_WIDTH || src.len % width) {
        PyErr_SetString(PyExc_ValueError, "width must be 1..16 and divide the source's length");
        goto done;
    }
    if (base_arg != Py_None) {
        if (PyObject_GetBuffer(base_arg, &base, PyBUF_C_CONTIGUOUS) < 0) {
            goto done;
        }
        have_base = 1;
        if (base.len != src.len || (strcmp(op, "x") && strcmp(op, "s"))) {
            PyErr_SetString(PyExc_ValueError, "a base must be as long as the source, with op 'x' (XOR) or 's' (subtract)");
            goto done;
        }
    }
    if (plane_buffers(planes_arg, views, width, src.len / width, 1, "the output") < 0) {
        goto done;
    }
    held = width;
    for (int k = 0; k < width; k++) {
        pointers[k] = views[k].buf;
    }
    uint8_t *work = have_base ? PyMem_RawMalloc((size_t)width * BLOCK) : NULL;
    if (have_base && !work) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    split(pointers, src.buf, have_base ? base.buf : NULL, op[0], src.len / width, width, work);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(work);
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    if (have_base) PyBuffer_Release(&base);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef methods[] = {
    {"merge", py_merge, METH_VARARGS,
     "merge(out, levels, ops, width): out[i*width + k] = plane k of the first level, with each further level's "
     "plane k applied by its op ('x' XOR, 'a' add mod 256), at element i. levels: sequences of width buffers "
     "of len(out) // width bytes; ops: one character a level after the first."},
    {"split", py_split, METH_VARARGS,
     "split(src, width, planes[, base, op]): planes[k][i] = byte k of element i of src, or of src XOR base "
     "(op 'x') or src - base bytewise mod 256 (op 's')."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planes", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__planes(void) {
    return PyModule_Create(&module);
}
