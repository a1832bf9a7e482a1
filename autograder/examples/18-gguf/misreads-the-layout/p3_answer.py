def q4_1_input_grad(D, packed):
    """dX (n × d) of Y = X Ŵᵀ, with Ŵ (m × d) decoded from Q4_1 rows packed (m, d/32·20)."""
    # Right formula; it inherits the nibble order of dequantize_q4_1 above.
    W_hat = np.asarray(dequantize_q4_1(packed.reshape(-1, 20)), dtype=np.float64).reshape(packed.shape[0], -1)
    return D @ W_hat
