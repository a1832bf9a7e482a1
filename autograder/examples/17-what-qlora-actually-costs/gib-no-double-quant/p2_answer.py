# Your answer goes in `answer_p2`.
# Typical mistake: the fp32 absmax per block, as if there were no double quantization.
answer_p2 = 32 / 128
