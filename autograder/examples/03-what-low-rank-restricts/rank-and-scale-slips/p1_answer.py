def best_rank_k(M, k):
    # Return the best rank-k approximation of the d × m array M, as a d × m array.
    # Typical mistake: the last k singular values of np.linalg.svd are the smallest, not the largest.
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return (U[:, -k:] * S[-k:]) @ Vt[-k:, :]
