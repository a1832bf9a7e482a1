# Your answer goes in `answer_p4`.
# Typical mistake: the adapter scaled by lora_alpha (16) instead of lora_alpha / r, so s stays put; with B's entries of
# variance 1/r, ||xAB|| is flat in r, so the answer comes out 1.
answer_p4 = 16 * math.sqrt(64 * (1 / 64)) / (16 * math.sqrt(4 * (1 / 4)))
