"""The optional C extension stoker._jpegroi (region-of-interest JPEG decoding).

Everything else about the package is in pyproject.toml. The extension is optional: where it
cannot be compiled (no C compiler) stoker still installs and decodes JPEGs with simplejpeg.
It links no libjpeg; at run time it loads the one Pillow bundles (see csrc/jpegroi.c).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "stoker._jpegroi",
            sources=["csrc/jpegroi.c"],
            include_dirs=["csrc/libjpeg-turbo"],
            depends=[
                "csrc/libjpeg-turbo/jpeglib.h",
                "csrc/libjpeg-turbo/jmorecfg.h",
                "csrc/libjpeg-turbo/jconfig.h",
            ],
            libraries=[] if sys.platform == "win32" else ["dl"],
            optional=True,
        )
    ]
)
