/* jconfig.h for the libjpeg v6.2 API of libjpeg-turbo 3.2.0, filled in by hand from
 * src/jconfig.h.in (the values the jpeg62 shared library, as Pillow's wheels bundle it,
 * is built with). Only the declarations matter here: stoker's _jpegroi extension links
 * nothing from libjpeg-turbo; it loads Pillow's copy at run time and
 * jpeg_CreateDecompress checks the struct size. Licence: LICENSE.md and README.ijg. */

#define JPEG_LIB_VERSION  62
#define LIBJPEG_TURBO_VERSION  3.2.0
#define LIBJPEG_TURBO_VERSION_NUMBER  3002000
#define C_ARITH_CODING_SUPPORTED 1
#define D_ARITH_CODING_SUPPORTED 1
#define MEM_SRCDST_SUPPORTED  1
#define WITH_SIMD 1

#ifndef BITS_IN_JSAMPLE
#define BITS_IN_JSAMPLE  8
#endif

#ifdef _WIN32

#undef RIGHT_SHIFT_IS_UNSIGNED

#ifndef __RPCNDR_H__
typedef unsigned char boolean;
#endif
#define HAVE_BOOLEAN

#if !(defined(_BASETSD_H_) || defined(_BASETSD_H))
typedef short INT16;
typedef signed int INT32;
#endif
#define XMD_H

#endif
