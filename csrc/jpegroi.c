/*
 * stoker._jpegroi: decode only a region of a JPEG, at a DCT scale, with the GIL released.
 *
 * libjpeg-turbo's jpeg_crop_scanline + jpeg_skip_scanlines (what TensorFlow's
 * decode_and_crop_jpeg does): the rows above the region are entropy-decoded and skipped,
 * the columns outside it are neither inverse-transformed nor colour-converted, and decoding
 * stops after the region's last row.
 *
 * No libjpeg is linked: load() takes the path of the libjpeg-turbo shared library that
 * Pillow's wheels bundle (v6.2 API) and looks its functions up. jpeg_CreateDecompress checks
 * the library's version and struct size against the headers in csrc/libjpeg-turbo, so a
 * mismatch is an error (stoker then decodes with simplejpeg).
 *
 * Decoding matches simplejpeg.decode_jpeg(colorspace="RGB", fastdct=True,
 * fastupsample=True, strict=True): the fast integer DCT, no fancy upsampling, warnings
 * (corrupt data) are errors, CMYK/YCCK converted to RGB with simplejpeg's formula.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeglib.h"

#ifndef _WIN32
#include <dlfcn.h>
#endif

typedef struct jpeg_error_mgr *(*std_error_fn)(struct jpeg_error_mgr *);
typedef void (*create_fn)(j_decompress_ptr, int, size_t);
typedef void (*destroy_fn)(j_decompress_ptr);
typedef void (*mem_src_fn)(j_decompress_ptr, const unsigned char *, unsigned long);
typedef int (*read_header_fn)(j_decompress_ptr, boolean);
typedef boolean (*start_fn)(j_decompress_ptr);
typedef void (*crop_fn)(j_decompress_ptr, JDIMENSION *, JDIMENSION *);
typedef JDIMENSION (*skip_fn)(j_decompress_ptr, JDIMENSION);
typedef JDIMENSION (*read_fn)(j_decompress_ptr, JSAMPARRAY, JDIMENSION);
typedef boolean (*finish_fn)(j_decompress_ptr);

/* Set once by load(), with the GIL held; read only afterwards. */
static struct {
    std_error_fn std_error;
    create_fn create;
    destroy_fn destroy;
    mem_src_fn mem_src;
    read_header_fn read_header;
    start_fn start;
    crop_fn crop;
    skip_fn skip;
    read_fn read;
    finish_fn finish;
    int loaded;
} lib;

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    /* level -1 is a warning (corrupt data, premature end): an error here, as simplejpeg's
       strict mode makes it. Trace messages (level >= 0) are dropped. */
    if (level < 0) on_error(cinfo);
}

static void on_output(j_common_ptr cinfo) { (void)cinfo; }

#ifndef _WIN32
static void *symbol(void *handle, const char *name) {
    void *found = dlsym(handle, name);
    if (found == NULL) PyErr_Format(PyExc_OSError, "libjpeg has no %s", name);
    return found;
}
#endif

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s:load", &path)) return NULL;
#ifdef _WIN32
    PyErr_SetString(PyExc_OSError, "loading libjpeg is not supported on Windows");
    return NULL;
#else
    if (lib.loaded) Py_RETURN_NONE;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, why ? why : "unknown error");
        return NULL;
    }
    /* The handle stays open: the functions are used for the life of the process. */
    if (!(lib.std_error = (std_error_fn)symbol(handle, "jpeg_std_error")) ||
        !(lib.create = (create_fn)symbol(handle, "jpeg_CreateDecompress")) ||
        !(lib.destroy = (destroy_fn)symbol(handle, "jpeg_destroy_decompress")) ||
        !(lib.mem_src = (mem_src_fn)symbol(handle, "jpeg_mem_src")) ||
        !(lib.read_header = (read_header_fn)symbol(handle, "jpeg_read_header")) ||
        !(lib.start = (start_fn)symbol(handle, "jpeg_start_decompress")) ||
        !(lib.crop = (crop_fn)symbol(handle, "jpeg_crop_scanline")) ||
        !(lib.skip = (skip_fn)symbol(handle, "jpeg_skip_scanlines")) ||
        !(lib.read = (read_fn)symbol(handle, "jpeg_read_scanlines")) ||
        !(lib.finish = (finish_fn)symbol(handle, "jpeg_finish_decompress")))
        return NULL;
    lib.loaded = 1;
    Py_RETURN_NONE;
#endif
}

typedef struct {
    const unsigned char *data;
    size_t size;
    int num, denom;          /* DCT scale */
    int width, height;       /* expected scaled size (checked) */
    int x0, y0, x1, y1;      /* region in scaled pixels */
    unsigned char *out;      /* (y1 - y0) rows of `stride` bytes */
    Py_ssize_t stride;
    int x_offset, out_width; /* results: the region after widening to an iMCU column */
} job;

/* Runs without the GIL. Returns 0, or -1 with `message` set. */
static int decode_region(job *work, char *message) {
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    unsigned char *volatile cmyk = NULL;
    volatile int created = 0;

    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = lib.std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.pub.output_message = on_output;
    if (setjmp(err.jump)) {
        strncpy(message, err.message, JMSG_LENGTH_MAX - 1);
        message[JMSG_LENGTH_MAX - 1] = '\0';
        if (created) lib.destroy(&cinfo);
        free(cmyk);
        return -1;
    }
    lib.create(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
    created = 1;
    lib.mem_src(&cinfo, work->data, (unsigned long)work->size);
    if (lib.read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
        snprintf(message, JMSG_LENGTH_MAX, "no image in the JPEG data");
        lib.destroy(&cinfo);
        return -1;
    }
    int is_cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = is_cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.scale_num = (unsigned int)work->num;
    cinfo.scale_denom = (unsigned int)work->denom;
    cinfo.dct_method = JDCT_IFAST;
    cinfo.do_fancy_upsampling = FALSE;
    lib.start(&cinfo);
    if ((int)cinfo.output_width != work->width || (int)cinfo.output_height != work->height) {
        snprintf(message, JMSG_LENGTH_MAX, "decodes to %ux%u, expected %dx%d",
                 cinfo.output_width, cinfo.output_height, work->width, work->height);
        lib.destroy(&cinfo);
        return -1;
    }
    JDIMENSION x_offset = (JDIMENSION)work->x0, width = (JDIMENSION)(work->x1 - work->x0);
    if (width != cinfo.output_width) lib.crop(&cinfo, &x_offset, &width);
    if ((Py_ssize_t)width * 3 > work->stride || (int)(x_offset + width) < work->x1) {
        snprintf(message, JMSG_LENGTH_MAX, "the crop widened beyond the output buffer");
        lib.destroy(&cinfo);
        return -1;
    }
    if (work->y0 > 0 && lib.skip(&cinfo, (JDIMENSION)work->y0) != (JDIMENSION)work->y0) {
        snprintf(message, JMSG_LENGTH_MAX, "cannot skip to row %d", work->y0);
        lib.destroy(&cinfo);
        return -1;
    }
    if (is_cmyk) {
        cmyk = malloc((size_t)width * 4);
        if (cmyk == NULL) {
            snprintf(message, JMSG_LENGTH_MAX, "out of memory");
            lib.destroy(&cinfo);
            return -1;
        }
    }
    /* Rows are asked for many at a time, as TurboJPEG's own decompressor does: one at a
       time costs the merged (fast) upsampler a spare-row copy and a call per row. */
    JSAMPROW rows[64];
    while (!is_cmyk && (int)cinfo.output_scanline < work->y1) {
        int first = (int)cinfo.output_scanline, count = work->y1 - first;
        if (count > 64) count = 64;
        for (int i = 0; i < count; i++)
            rows[i] = work->out + (Py_ssize_t)(first - work->y0 + i) * work->stride;
        if (lib.read(&cinfo, rows, (JDIMENSION)count) < 1) {
            snprintf(message, JMSG_LENGTH_MAX, "no scanline at row %u", cinfo.output_scanline);
            lib.destroy(&cinfo);
            return -1;
        }
    }
    while (is_cmyk && (int)cinfo.output_scanline < work->y1) {
        unsigned char *row = work->out + (cinfo.output_scanline - work->y0) * work->stride;
        JSAMPROW target = cmyk;
        if (lib.read(&cinfo, &target, 1) != 1) {
            snprintf(message, JMSG_LENGTH_MAX, "no scanline at row %u", cinfo.output_scanline);
            lib.destroy(&cinfo);
            free(cmyk);
            return -1;
        }
        if (is_cmyk) {
            /* simplejpeg's cmyk2color (Adobe's inverted CMYK) */
            const unsigned char *p = cmyk;
            for (JDIMENSION i = 0; i < width; i++, p += 4, row += 3) {
                unsigned char k = p[3];
                row[0] = (unsigned char)(k - (((unsigned char)~p[0]) * k >> 8));
                row[1] = (unsigned char)(k - (((unsigned char)~p[1]) * k >> 8));
                row[2] = (unsigned char)(k - (((unsigned char)~p[2]) * k >> 8));
            }
        }
    }
    /* A region down to the last row reads on to the end of the file, as a whole decode
       does (damage after the last row is a warning there). Otherwise destroying aborts
       the decompression: the rows below the region are never decoded. */
    if (cinfo.output_scanline == cinfo.output_height) lib.finish(&cinfo);
    lib.destroy(&cinfo);
    free(cmyk);
    work->x_offset = (int)x_offset;
    work->out_width = (int)width;
    return 0;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    job work;
    if (!PyArg_ParseTuple(args, "y*(ii)(ii)(iiii)w*:decode", &data, &work.num, &work.denom,
                          &work.width, &work.height, &work.x0, &work.y0, &work.x1, &work.y1,
                          &out))
        return NULL;
    PyObject *result = NULL;
    if (!lib.loaded) {
        PyErr_SetString(PyExc_RuntimeError, "load() libjpeg first");
    } else if (work.num < 1 || work.denom < 1 || work.x0 < 0 || work.y0 < 0 ||
               work.x1 <= work.x0 || work.y1 <= work.y0 || work.x1 > work.width ||
               work.y1 > work.height) {
        PyErr_Format(PyExc_ValueError, "bad region (%d, %d, %d, %d) of %dx%d", work.x0,
                     work.y0, work.x1, work.y1, work.width, work.height);
    } else if (out.len < (Py_ssize_t)(work.y1 - work.y0) * work.width * 3) {
        PyErr_SetString(PyExc_ValueError, "output buffer too small");
    } else {
        char message[JMSG_LENGTH_MAX];
        int status;
        work.data = data.buf;
        work.size = (size_t)data.len;
        work.out = out.buf;
        work.stride = (Py_ssize_t)work.width * 3;
        Py_BEGIN_ALLOW_THREADS
        status = decode_region(&work, message);
        Py_END_ALLOW_THREADS
        if (status == 0)
            result = Py_BuildValue("(ii)", work.x_offset, work.out_width);
        else
            PyErr_SetString(PyExc_ValueError, message);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS,
     "load(path): use the libjpeg-turbo shared library (v6.2 API) at path."},
    {"decode", decode, METH_VARARGS,
     "decode(data, (num, denom), (width, height), (x0, y0, x1, y1), out) -> "
     "(x_offset, out_width)\n\n"
     "Decode rows y0..y1 and at least columns x0..x1 of a JPEG at scale num/denom (which\n"
     "must give width x height) as RGB into out, rows of width * 3 bytes. The columns\n"
     "decoded start at x_offset <= x0 (an iMCU boundary) and are out_width wide."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegroi",
    "Region-of-interest JPEG decoding through Pillow's libjpeg-turbo (see stoker.pipeline.decode).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
