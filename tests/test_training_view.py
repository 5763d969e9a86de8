"""The training app's folder view (``fitted``: every image of a folder at the model's size) has the evaluation view's
sizes and offsets, torchvision's arithmetic: the longer side truncated, the centre crop's offsets rounded."""

import numpy as np
import pytest
from PIL import Image
from test_view_arithmetic import coordinates, torchvision_center_crop_offsets, torchvision_resized_size

from keras_preact_training.data.sources import fitted

pytestmark = [pytest.mark.notf]


@pytest.mark.parametrize("height, width, size, crop_fraction", [
    (243, 323, (32, 32), 32 / 35),  # 35: the longer side 46.52 -> 46, the top offset round(1.5) = 2
    (323, 243, (32, 32), 32 / 35),
    (240, 320, (224, 224), 224 / 248),  # 248: 330.67 -> 330
    (61, 45, (32, 32), 0.875),  # 37: 50.16 -> 50, offsets round(2.5) = 2 and round(9) = 9
    (32, 32, (32, 32), 1.0),  # at the crop size: the image
])
def test_fitted_is_torchvisions_resize_and_centre_crop(height, width, size, crop_fraction):
    pixels = coordinates(height, width)
    side = int(np.ceil(round(size[0] / crop_fraction, 6)))
    new_height, new_width = torchvision_resized_size(height, width, side)
    resized = np.asarray(Image.fromarray(pixels).resize((new_width, new_height), Image.BILINEAR))
    top, left = torchvision_center_crop_offsets(new_height, new_width, *size)
    view = fitted(pixels, size, crop_fraction)
    assert view.dtype == np.uint8 and view.shape == (*size, 3)
    np.testing.assert_array_equal(view, resized[top:top + size[0], left:left + size[1]])
