def quantized_linear_backward(D, codes, absmax, code, blocksize):
    # The input gradient n × d of Y = X Ŵᵀ, with Ŵ dequantized from 4-bit codes (m × d) and per-block absmax.
    m, d = codes.shape
    # blocks counted per row: row · (d // blocksize) + col // blocksize
    block = np.arange(m)[:, None] * (d // blocksize) + np.arange(d)[None, :] // blocksize
    W_hat = code[codes] * absmax[block]
    return D @ W_hat
