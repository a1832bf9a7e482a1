def dequantize_q4_1(block_bytes):
    """Q4_1 blocks (n_blocks, 20) uint8 -> weights (n_blocks, 32): w = d·q + m."""
    # Typical mistake: byte j's two nibbles taken as neighbours (elements 2j, 2j + 1), as if the codes were interleaved.
    b = np.asarray(block_bytes, dtype=np.uint8).reshape(-1, 20)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    m = b[:, 2:4].copy().view(np.float16).astype(np.float64)
    qs = b[:, 4:]
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(len(b), 32)
    return d * q + m
