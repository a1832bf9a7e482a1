def lora_param_count(shapes, targets, r):
    """Trainable entries of rank-r adapters on `targets` in one block; shapes: name -> (d_in, d_out)."""
    # Typical mistake: every projection treated as square, d_in × d_in.
    return sum(2 * r * shapes[t][0] for t in targets)
