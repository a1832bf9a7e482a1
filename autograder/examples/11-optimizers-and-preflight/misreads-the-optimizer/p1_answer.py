def factor_update(A, B, dA, dB, s):
    """The exact change of s*A@B when A -> A + dA and B -> B + dB; returns a d x m array."""
    # Typical mistake: only the first-order terms; the cross term dA @ dB is dropped.
    return s * (dA @ B + A @ dB)
