def quantize_block_nf4(x, levels):
    """One block of NF4: (packed bytes, absmax), as bitsandbytes computes them."""
    x = np.asarray(x, dtype=np.float32)
    levels = np.asarray(levels, dtype=np.float32)
    absmax = np.abs(x).max()
    scaled = np.clip(x / absmax, -1, 1)
    midpoints = (levels[:-1] + levels[1:]) / np.float32(2)
    # Typical mistake: "round half up", so a value exactly on a midpoint takes the upper code.
    codes = np.searchsorted(midpoints, scaled, side="right")
    packed = (codes[0::2] << 4) | codes[1::2]
    return packed.astype(np.uint8), float(absmax)
