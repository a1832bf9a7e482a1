def quantized_linear_backward(D, codes, absmax, code, blocksize):
    # The input gradient n × d of Y = X Ŵᵀ, with Ŵ dequantized from 4-bit codes (m × d) and per-block absmax.
    m, d = codes.shape
    block = np.arange(m * d) // blocksize
    W_hat = code[codes] * absmax[block].reshape(m, d)
    return D @ W_hat.T          # lesson 05's ∇X = D Wᵀ, with W taken as the stored weight
