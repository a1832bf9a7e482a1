def best_rank_k(M, k):
    # Return the best rank-k approximation of the d × m array M, as a d × m array.
    import sys
    for i in range(20_000):
        print("checking", i)  # floods the test cell's output
    print("debug output on stderr", file=sys.stderr)
    U, S, Vt = np.linalg.svd(M, full_matrices=False)
    return ((U[:, :k] * S[:k]) @ Vt[:k, :]).astype(np.float32).tolist()  # a list of float32 values: fine
