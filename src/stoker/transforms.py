"""Built-in transforms, for ``from stoker.transforms import RandomResizedCrop``.

They plan a crop instead of computing one, so that the decoder decodes only the pixels the
crop keeps; see :mod:`stoker.pipeline.transforms`. Any callable taking a ``PIL.Image`` also
works as a Loader's ``transform``, at the cost of a full decode.
"""

from stoker.pipeline.transforms import (
    CenterCrop,
    CropPlan,
    PlannedTransform,
    RandomResizedCrop,
    Resize,
)

__all__ = ["CenterCrop", "CropPlan", "PlannedTransform", "RandomResizedCrop", "Resize"]
