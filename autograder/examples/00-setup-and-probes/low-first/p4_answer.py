def nibble_pack(codes):
    """Pack 4-bit codes two to a byte, the first in the high nibble; uint8 array of (n + 1) // 2 bytes."""
    # Typical mistake: the first code of each pair goes into the low nibble (little-endian habit).
    q = np.asarray(codes).astype(np.int64).reshape(-1)
    if q.size % 2:
        q = np.concatenate([q, [0]])
    return ((q[1::2] << 4) | q[0::2]).astype(np.uint8)
