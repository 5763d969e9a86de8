"""A GIF's first frame, cut from its block structure (``gif_first_frame``): what the server decodes of an
uploaded GIF, read in at most ``MAX_GIF_BLOCKS`` blocks."""

import struct

# Blocks and sub-blocks read up to the end of a GIF's first frame, at most: a 4096 x 4096 frame of 12-bit codes is
# ~100K sub-blocks of 255 bytes; millions of empty extension blocks (3 bytes each) would cost seconds each.
MAX_GIF_BLOCKS = 1 << 20


def _gif_sub_blocks_end(data, pos, budget):
    """The offset after the sub-blocks starting at ``pos`` (each a length byte and its bytes, a 0 last), each counted
    in ``budget`` (a one-element list of the blocks left)."""
    while pos < len(data):
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError(f"The GIF holds more than {MAX_GIF_BLOCKS} blocks before the end of its first frame.")
        size = data[pos]
        pos += 1 + size
        if size == 0:
            return pos
    raise ValueError("The GIF ends inside its first frame.")


def gif_first_frame(data):
    """``(gif, (width, height))``: a GIF's bytes cut after its first frame (the trailer appended) and
    that frame's size, read from the block structure alone: nothing is decompressed, and the cost is
    the bytes up to the end of the first frame.

    ``tf.io.decode_image(expand_animations=False)`` keeps the first frame of a GIF, but giflib reads and
    decompresses every frame first (``DGifSlurp``): 1,500 frames of 1024 x 1024 in a 2.8 MB file cost
    seconds and gigabytes. The cut GIF decodes to the same first frame. Returns ``data`` itself when
    nothing but the trailer follows its first frame; ValueError when it is not a GIF, ends before its
    first frame does, or holds more than ``MAX_GIF_BLOCKS`` blocks and sub-blocks up to there.

    Examples:
        >>> import io
        >>> from PIL import Image
        >>> from keras_preact_serving.gif import gif_first_frame
        >>> frames, animation = [Image.new("L", (4, 3), 40 * i) for i in range(5)], io.BytesIO()
        >>> frames[0].save(animation, "GIF", save_all=True, append_images=frames[1:])
        >>> gif, size = gif_first_frame(animation.getvalue())
        >>> size, len(gif) < len(animation.getvalue()), Image.open(io.BytesIO(gif)).n_frames
        ((4, 3), True, 1)
    """
    data = bytes(data)
    if len(data) < 13 or not data.startswith((b"GIF87a", b"GIF89a")):
        raise ValueError("Not a GIF: no GIF87a/GIF89a header.")
    flags, pos, budget = data[10], 13, [MAX_GIF_BLOCKS]
    if flags & 0x80:  # the global colour table
        pos += 3 << ((flags & 7) + 1)
    while pos < len(data):
        block = data[pos]
        if block == 0x21:  # an extension: its label, then sub-blocks
            pos = _gif_sub_blocks_end(data, pos + 2, budget)
        elif block == 0x2C:  # an image: its descriptor, local colour table, LZW code size, sub-blocks
            if pos + 10 > len(data):
                break
            size = struct.unpack_from("<HH", data, pos + 5)
            flags, pos = data[pos + 9], pos + 10
            if flags & 0x80:
                pos += 3 << ((flags & 7) + 1)
            end = _gif_sub_blocks_end(data, pos + 1, budget)
            return (data if data[end:] == b";" else data[:end] + b";"), size
        else:  # the trailer, or a block giflib refuses too
            raise ValueError(f"The GIF has no frame (block 0x{block:02x} before any image).")
    raise ValueError("The GIF ends before its first frame.")
