def absmax_quantize_block(x, bits):
    """Symmetric absmax quantization of one block; returns (codes, absmax)."""
    # Typical mistake: divides by absmax but never multiplies by Q = 2**(bits - 1) - 1.
    absmax = np.abs(x).max()
    if absmax == 0:
        return np.zeros_like(x), 0.0
    return np.round(x / absmax), absmax
