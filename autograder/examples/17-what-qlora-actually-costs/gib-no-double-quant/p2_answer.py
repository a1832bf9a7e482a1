# Your answer goes in `answer_p2`.
# Typical mistake: the fp32 absmax per block (0.5 bits per weight), as if there were no double quantization.
answer_p2 = (24 * 2**30 - 12 * 20e6) / (0.5 + 4 / 64) / 1e9
