/* Pillow's bilinear resize of an 8-bit RGB image, bit for bit, written straight to CHW order.
 *
 * The arithmetic is Pillow 13's (src/libImaging/Resample.c): coefficients computed in double
 * from a float box, normalized to 22-bit fixed point, a horizontal pass over the rows the
 * vertical pass needs, then the vertical pass, each sum rounded by adding 1 << 21 and clipped
 * to 0..255. Only the loops differ: the horizontal pass works on the four bytes of a pixel at
 * once and the vertical pass on whole rows, which the compiler vectorizes (an AVX2 clone is
 * chosen at run time where the CPU has it), and the result is written as three planes instead
 * of packed pixels. tests/preprocess/test_fast_resize.py compares every byte with Pillow's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

static inline uint8_t
clip8(int32_t in) {
    int32_t v = in >> PRECISION_BITS;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

static inline double
bilinear_filter(double x) {
    if (x < 0.0) {
        x = -x;
    }
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for the bilinear filter. Returns ksize,
   or 0 when out of memory. */
static int
coefficients(int in_size, float in0, float in1, int out_size, int **bounds_out, int32_t **kk_out) {
    double scale, filterscale, support;
    int ksize, xx, x, xmin, xmax;
    double *pre;
    int32_t *kk;
    int *bounds;

    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0) {
        filterscale = 1.0;
    }
    support = 1.0 * filterscale;
    ksize = (int)ceil(support) * 2 + 1;
    pre = malloc((size_t)out_size * ksize * sizeof(double));
    kk = malloc((size_t)out_size * ksize * sizeof(int32_t));
    bounds = malloc((size_t)out_size * 2 * sizeof(int));
    if (!pre || !kk || !bounds) {
        free(pre);
        free(kk);
        free(bounds);
        return 0;
    }
    double inv_filterscale = 1.0 / filterscale;
    for (xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        double *k = &pre[xx * ksize];
        xmin = (int)(center - support + 0.5);
        if (xmin < 0) {
            xmin = 0;
        }
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) {
            xmax = in_size;
        }
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double w = bilinear_filter((x + xmin - center + 0.5) * inv_filterscale);
            k[x] = w;
            ww += w;
        }
        if (ww != 0.0) {
            for (x = 0; x < xmax; x++) {
                k[x] /= ww;
            }
        }
        for (; x < ksize; x++) {
            k[x] = 0;
        }
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    for (x = 0; x < out_size * ksize; x++) {
        kk[x] = pre[x] < 0 ? (int32_t)(-0.5 + pre[x] * (1 << PRECISION_BITS))
                           : (int32_t)(0.5 + pre[x] * (1 << PRECISION_BITS));
    }
    free(pre);
    *bounds_out = bounds;
    *kk_out = kk;
    return ksize;
}

/* Output pixels [from, xsize) of one row, as horizontal_generic computes them. */
static void
tail_pixels(const uint8_t *line, uint8_t *out, int from, int xsize, int ksize, const int *bounds,
            const int32_t *kk) {
    for (int xx = from; xx < xsize; xx++) {
        const int32_t *k = &kk[xx * ksize];
        const uint8_t *pixel = line + (size_t)bounds[xx * 2] * 4;
        int xmax = bounds[xx * 2 + 1];
        int32_t ss[3] = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1)};
        for (int x = 0; x < xmax; x++) {
            for (int c = 0; c < 3; c++) {
                ss[c] += pixel[x * 4 + c] * k[x];
            }
        }
        out[xx * 4 + 0] = clip8(ss[0]);
        out[xx * 4 + 1] = clip8(ss[1]);
        out[xx * 4 + 2] = clip8(ss[2]);
        out[xx * 4 + 3] = 0;
    }
}

/* Rows [first, first + rows) of `src` (RGBX, `linesize` bytes a row) resized to `xsize` pixels. */
static void
horizontal_generic(const uint8_t *src, Py_ssize_t linesize, int first, int rows, uint8_t *dst, int xsize,
                   int ksize, const int *bounds, const int32_t *kk) {
    for (int yy = 0; yy < rows; yy++) {
        tail_pixels(src + (Py_ssize_t)(yy + first) * linesize, dst + (size_t)yy * xsize * 4, 0, xsize, ksize, bounds,
                    kk);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

/* Eight 32-bit sums (two RGBX pixels) as eight bytes: shifted, X set to 0, clipped to 0..255. */
__attribute__((target("avx2"))) static inline __m128i
pack_rgbx(__m256i acc, __m256i alpha) {
    acc = _mm256_andnot_si256(alpha, _mm256_srai_epi32(acc, PRECISION_BITS));
    __m128i packed = _mm_packs_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    return _mm_packus_epi16(packed, packed);
}

/* horizontal_generic with AVX2. Each 22-bit coefficient is split in two 11-bit halves so that
   16-bit multiply-adds (vpmaddwd: pixel x weight for two taps at once, summed in 32 bits) give
   exactly the scalar code's 32-bit sums: sum(p * k) = (sum(p * (k >> 11)) << 11) + sum(p * (k & 2047)).
   Four taps a step (one 16-byte load, one byte shuffle), two output pixels and two rows at a time;
   every pixel runs `ksize` taps rounded up to 4 (the coefficients past its own are 0), so pixels
   whose taps would read past the row's end are left to `tail_pixels`. */
__attribute__((target("avx2"))) static void
horizontal_avx2(const uint8_t *src, Py_ssize_t linesize, int first, int rows, uint8_t *dst, int xsize, int ksize,
                const int *bounds, const int32_t *kk, int width) {
    int groups = (ksize + 3) / 4;
    int pairs = 0; /* output pixels [0, 2 * pairs) can read all 4 * groups taps inside the row */
    while (pairs * 2 + 1 < xsize && bounds[(pairs * 2 + 1) * 2] + 4 * groups <= width) {
        pairs++;
    }
    for (int xx = 0; xx < 2 * pairs; xx++) {
        for (int t = 0; t < ksize; t++) {
            if (kk[xx * ksize + t] < 0 || kk[xx * ksize + t] > (1 << PRECISION_BITS)) {
                pairs = 0; /* not a bilinear coefficient: the scalar code does it all */
            }
        }
    }
    /* per output pixel and group: 16 int16 high halves, then 16 low halves */
    int16_t *wide = malloc((size_t)(pairs ? 2 * pairs : 1) * groups * 32 * sizeof(int16_t));
    if (!wide) {
        horizontal_generic(src, linesize, first, rows, dst, xsize, ksize, bounds, kk);
        return;
    }
    for (int xx = 0; xx < 2 * pairs; xx++) {
        for (int g = 0; g < groups; g++) {
            int16_t *w = &wide[((size_t)xx * groups + g) * 32];
            for (int lane = 0; lane < 16; lane++) {
                int t = g * 4 + (lane / 8) * 2 + (lane & 1); /* lanes 0-7: taps 0, 1; 8-15: taps 2, 3 */
                int32_t k = t < ksize ? kk[xx * ksize + t] : 0;
                w[lane] = (int16_t)(k >> 11);
                w[16 + lane] = (int16_t)(k & 2047);
            }
        }
    }
    const __m256i spread = _mm256_setr_epi8(0, -1, 4, -1, 1, -1, 5, -1, 2, -1, 6, -1, 3, -1, 7, -1,
                                            8, -1, 12, -1, 9, -1, 13, -1, 10, -1, 14, -1, 11, -1, 15, -1);
    const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    const __m256i alpha = _mm256_setr_epi32(0, 0, 0, -1, 0, 0, 0, -1);
/* taps 4g..4g+3 of the pixel at `at`, in both rows, added to the sums */
#define TAPS4(g)                                                                                                    \
    do {                                                                                                            \
        __m256i whi = _mm256_loadu_si256((const __m256i *)(w + (g) * 32));                                          \
        __m256i wlo = _mm256_loadu_si256((const __m256i *)(w + (g) * 32 + 16));                                     \
        __m256i p0 = _mm256_shuffle_epi8(                                                                           \
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(line + at + (g) * 16))), spread);          \
        __m256i p1 = _mm256_shuffle_epi8(                                                                           \
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(line1 + at + (g) * 16))), spread);         \
        hi0 = _mm256_add_epi32(hi0, _mm256_madd_epi16(p0, whi));                                                    \
        lo0 = _mm256_add_epi32(lo0, _mm256_madd_epi16(p0, wlo));                                                    \
        hi1 = _mm256_add_epi32(hi1, _mm256_madd_epi16(p1, whi));                                                    \
        lo1 = _mm256_add_epi32(lo1, _mm256_madd_epi16(p1, wlo));                                                    \
    } while (0)
    for (int yy = 0; yy < rows; yy += 2) {
        /* two rows at once share each weight load; an odd last row is computed twice */
        int y1 = yy + 1 < rows ? yy + 1 : yy;
        const uint8_t *line = src + (Py_ssize_t)(yy + first) * linesize;
        const uint8_t *line1 = src + (Py_ssize_t)(y1 + first) * linesize;
        uint8_t *out = dst + (size_t)yy * xsize * 4;
        uint8_t *out1 = dst + (size_t)y1 * xsize * 4;
        for (int pair = 0; pair < pairs; pair++) {
            __m256i sum[2][2]; /* [row][pixel of the pair] */
            for (int p = 0; p < 2; p++) {
                int xx = pair * 2 + p;
                size_t at = (size_t)bounds[xx * 2] * 4;
                const int16_t *w = &wide[(size_t)xx * groups * 32];
                __m256i hi0 = _mm256_setzero_si256(), lo0 = hi0, hi1 = hi0, lo1 = hi0;
                if (groups == 2) { /* up to 8 taps (shrinking by up to 3.5x): unrolled */
                    TAPS4(0);
                    TAPS4(1);
                } else {
                    for (int g = 0; g < groups; g++) {
                        TAPS4(g);
                    }
                }
                sum[0][p] = _mm256_add_epi32(_mm256_slli_epi32(hi0, 11), lo0);
                sum[1][p] = _mm256_add_epi32(_mm256_slli_epi32(hi1, 11), lo1);
            }
            for (int r = 0; r < 2; r++) {
                /* each pixel's two halves (taps 0-1 and 2-3 of every group) added: [pixel 0 | pixel 1] */
                __m256i both = _mm256_add_epi32(_mm256_permute2x128_si256(sum[r][0], sum[r][1], 0x20),
                                                _mm256_permute2x128_si256(sum[r][0], sum[r][1], 0x31));
                _mm_storel_epi64((__m128i *)((r ? out1 : out) + pair * 8),
                                 pack_rgbx(_mm256_add_epi32(both, half), alpha));
            }
        }
        for (int row = yy; row <= y1; row++) {
            tail_pixels(row == yy ? line : line1, row == yy ? out : out1, pairs * 2, xsize, ksize, bounds, kk);
            if (y1 == yy) {
                break;
            }
        }
    }
    free(wide);
#undef TAPS4
}
#endif

static void
horizontal(const uint8_t *src, Py_ssize_t linesize, int first, int rows, uint8_t *dst, int xsize, int ksize,
           const int *bounds, const int32_t *kk, int width) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        horizontal_avx2(src, linesize, first, rows, dst, xsize, ksize, bounds, kk, width);
        return;
    }
#endif
    horizontal_generic(src, linesize, first, rows, dst, xsize, ksize, bounds, kk);
}

/* `src` (RGBX rows of `xsize` pixels, `linesize` bytes apart) resized to `ysize` rows, written as
   three planes of ysize x xsize bytes (`planar`) or as RGBX rows; `acc` holds xsize * 4 sums. */
MULTIVERSION static void
vertical(const uint8_t *src, Py_ssize_t linesize, int xsize, int ysize, int ksize, const int *bounds,
         const int32_t *kk, int32_t *acc, uint8_t *out, int planar) {
    int n = xsize * 4;
    size_t plane = (size_t)xsize * ysize;
    for (int yy = 0; yy < ysize; yy++) {
        const int32_t *k = &kk[yy * ksize];
        int ymin = bounds[yy * 2], ymax = bounds[yy * 2 + 1];
        for (int i = 0; i < n; i++) {
            acc[i] = 1 << (PRECISION_BITS - 1);
        }
        for (int y = 0; y < ymax; y++) {
            const uint8_t *line = src + (Py_ssize_t)(y + ymin) * linesize;
            int32_t weight = k[y];
            for (int i = 0; i < n; i++) {
                acc[i] += line[i] * weight;
            }
        }
        if (planar) {
            uint8_t *r = out + (size_t)yy * xsize, *g = r + plane, *b = g + plane;
            for (int xx = 0; xx < xsize; xx++) {
                r[xx] = clip8(acc[xx * 4 + 0]);
                g[xx] = clip8(acc[xx * 4 + 1]);
                b[xx] = clip8(acc[xx * 4 + 2]);
            }
        } else {
            uint8_t *row = out + (size_t)yy * n;
            for (int i = 0; i < n; i++) {
                row[i] = (i & 3) == 3 ? 0 : clip8(acc[i]);
            }
        }
    }
}

/* Plain copy of rows as planes (no vertical resize needed). */
static void
planes(const uint8_t *src, Py_ssize_t linesize, int first, int xsize, int ysize, uint8_t *out) {
    size_t plane = (size_t)xsize * ysize;
    for (int yy = 0; yy < ysize; yy++) {
        const uint8_t *line = src + (Py_ssize_t)(yy + first) * linesize;
        uint8_t *r = out + (size_t)yy * xsize;
        for (int xx = 0; xx < xsize; xx++) {
            r[xx] = line[xx * 4 + 0];
            r[xx + plane] = line[xx * 4 + 1];
            r[xx + 2 * plane] = line[xx * 4 + 2];
        }
    }
}

/* As ImagingResampleInner, for the bilinear filter and an RGBX image: the horizontal pass first,
   unless the height shrinks by more than twice what the width does. Returns 0, or -1 when out of
   memory. */
static int
resample(const uint8_t *src, int width, int height, const float box[4], int xsize, int ysize, uint8_t *out) {
    int *bounds_v = NULL, *bounds_h = NULL;
    int32_t *kk_v = NULL, *kk_h = NULL, *acc = NULL;
    uint8_t *temp = NULL, *temp2 = NULL;
    Py_ssize_t linesize = (Py_ssize_t)width * 4;
    int ksize_v = 0, ksize_h = 0, status = -1;

    /* _imaging.c's _resize: an integer box of the output's size is a crop */
    if (box[0] - (int)box[0] == 0 && box[2] - box[0] == xsize && box[1] - (int)box[1] == 0 &&
        box[3] - box[1] == ysize) {
        planes(src + (Py_ssize_t)(int)box[0] * 4, linesize, (int)box[1], xsize, ysize, out);
        return 0;
    }
    int need_horizontal = xsize != width || box[0] || box[2] != xsize;
    int need_vertical = ysize != height || box[1] || box[3] != ysize;
    int horizontal_first = !((height - ysize) > 0 && (height - ysize) > (width - xsize) * 2);
    if (need_vertical || need_horizontal) {
        ksize_v = coefficients(height, box[1], box[3], ysize, &bounds_v, &kk_v);
        if (!ksize_v) {
            return -1;
        }
    }
    if (need_horizontal) {
        ksize_h = coefficients(width, box[0], box[2], xsize, &bounds_h, &kk_h);
        if (!ksize_h) {
            goto done;
        }
    }
    if (!need_horizontal && !need_vertical) {
        planes(src, linesize, 0, xsize, ysize, out);
    } else if (!need_horizontal || !horizontal_first) {
        const uint8_t *rows = src; /* `width` pixels a row, as is the vertical pass's output */
        if (need_vertical) {
            acc = malloc((size_t)width * 4 * sizeof(int32_t));
            temp = need_horizontal ? malloc((size_t)width * ysize * 4) : NULL;
            if (!acc || (need_horizontal && !temp)) {
                goto done;
            }
            if (!need_horizontal) {
                vertical(src, linesize, width, ysize, ksize_v, bounds_v, kk_v, acc, out, 1);
                status = 0;
                goto done;
            }
            vertical(src, linesize, width, ysize, ksize_v, bounds_v, kk_v, acc, temp, 0);
            rows = temp;
        }
        temp2 = malloc((size_t)xsize * ysize * 4 + 1);
        if (!temp2) {
            goto done;
        }
        horizontal(rows, linesize, 0, ysize, temp2, xsize, ksize_h, bounds_h, kk_h, width);
        planes(temp2, (Py_ssize_t)xsize * 4, 0, xsize, ysize, out);
    } else {
        int first = bounds_v[0];
        int last = bounds_v[ysize * 2 - 2] + bounds_v[ysize * 2 - 1];
        for (int i = 0; i < ysize; i++) {
            bounds_v[i * 2] -= first;
        }
        temp = malloc((size_t)(last - first) * xsize * 4 + 1);
        if (!temp) {
            goto done;
        }
        horizontal(src, linesize, first, last - first, temp, xsize, ksize_h, bounds_h, kk_h, width);
        if (need_vertical) {
            acc = malloc((size_t)xsize * 4 * sizeof(int32_t));
            if (!acc) {
                goto done;
            }
            vertical(temp, (Py_ssize_t)xsize * 4, xsize, ysize, ksize_v, bounds_v, kk_v, acc, out, 1);
        } else {
            planes(temp, (Py_ssize_t)xsize * 4, 0, xsize, ysize, out);
        }
    }
    status = 0;
done:
    free(bounds_v);
    free(kk_v);
    free(bounds_h);
    free(kk_h);
    free(temp);
    free(temp2);
    free(acc);
    return status;
}

static PyObject *
rgbx_to_chw(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    int width, height, xsize, ysize;
    float box[4];

    if (!PyArg_ParseTuple(args, "y*ii(ffff)iiw*", &src, &width, &height, &box[0], &box[1], &box[2], &box[3], &xsize,
                          &ysize, &out)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (width < 1 || height < 1 || xsize < 1 || ysize < 1 || src.len < (Py_ssize_t)width * height * 4 ||
        out.len < (Py_ssize_t)xsize * ysize * 3) {
        PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the image and output sizes");
    } else if (!(box[0] >= 0 && box[1] >= 0 && box[2] <= width && box[3] <= height && box[2] - box[0] > 0 &&
                 box[3] - box[1] > 0)) { /* written so that a NaN fails too */
        PyErr_SetString(PyExc_ValueError, "box outside the image, empty or not a number");
    } else {
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = resample(src.buf, width, height, box, xsize, ysize, out.buf);
        Py_END_ALLOW_THREADS
        if (status) {
            PyErr_NoMemory();
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"rgbx_to_chw", rgbx_to_chw, METH_VARARGS,
     "rgbx_to_chw(src, width, height, box, xsize, ysize, out): Pillow's bilinear resize of the RGBX pixels in "
     "src (4 bytes a pixel, rows back to back) over box (left, top, right, bottom), written to out as three "
     "planes (R, G, B) of ysize x xsize bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_resample", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__resample(void) {
    return PyModule_Create(&module);
}
