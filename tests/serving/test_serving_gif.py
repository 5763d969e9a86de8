"""The serving app's GIF parsing (keras_preact_serving.gif): a GIF's first frame from its blocks alone."""

import numpy as np
import pytest

from keras_preact_serving.gif import gif_first_frame
from support import encode_image, photo_like


@pytest.mark.notf
def test_gif_first_frame_cuts_after_the_first_frame_from_the_blocks_alone():
    import io

    from PIL import Image

    frames = [Image.new("P", (20, 12), c) for c in (3, 90, 200)]
    for frame in frames:
        frame.putpalette([v for c in range(256) for v in (c, 255 - c, 7 * c % 256)])
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=40, loop=0)
    animated = out.getvalue()
    cut, size = gif_first_frame(animated)
    assert size == (20, 12) and len(cut) < len(animated) and cut.endswith(b";")
    with Image.open(io.BytesIO(cut)) as image, Image.open(io.BytesIO(animated)) as whole:
        assert (image.n_frames, whole.n_frames) == (1, 3)
        assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(whole.convert("RGB")))
    assert gif_first_frame(cut)[0] is cut  # nothing after its first frame: the bytes themselves
    for broken in (cut[:30], cut[:-3], b"GIF89a", encode_image(photo_like(4, 4), "PNG"), cut[:13] + b"\x3b"):
        with pytest.raises(ValueError):
            gif_first_frame(broken)
