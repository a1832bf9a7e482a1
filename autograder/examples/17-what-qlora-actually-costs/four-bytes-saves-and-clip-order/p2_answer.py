# Your answer goes in `answer_p2`.
# Typical mistake: the order of clipping and unscaling taken not to matter (the true norm, 0.5, is under the threshold).
answer_p2 = 0.5
