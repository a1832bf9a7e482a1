def quantize_block_nf4(x, levels):
    """One block of NF4: (packed bytes, absmax), as bitsandbytes computes them."""
    x = np.asarray(x, dtype=np.float32)
    levels = np.asarray(levels, dtype=np.float32)
    absmax = np.abs(x).max()
    scaled = np.clip(x / absmax, -1, 1)
    midpoints = (levels[:-1] + levels[1:]) / np.float32(2)
    codes = np.searchsorted(midpoints, scaled, side="left")
    # Typical mistake: "first element, lowest bits", the little-endian habit; bitsandbytes puts element 2i high.
    packed = codes[0::2] | (codes[1::2] << 4)
    return packed.astype(np.uint8), float(absmax)
