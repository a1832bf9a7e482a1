def dequantize_q4_1(block_bytes):
    """Q4_1 blocks (n_blocks, 20) uint8 -> weights (n_blocks, 32): w = d·q + m."""
    # Typical mistake: a scale-only decode, as for a symmetric format; m (bytes 2..3) is never used.
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    qs = b[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return d * q
