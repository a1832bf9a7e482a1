def absmax_quantize_blocks(x, bits, blocksize):
    """Blockwise absmax quantization of a 1-D array; returns (codes, absmax per block)."""
    # Typical mistake: one absmax for the whole tensor, repeated for every block.
    Q = 2 ** (bits - 1) - 1
    absmax = np.abs(x).max()
    n_blocks = -(-len(x) // blocksize)
    return np.round(x / absmax * Q), np.full(n_blocks, absmax)
