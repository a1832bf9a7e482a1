# Your answer goes in `answer_p4`.
# Typical mistake: the update scaled by lora_alpha (16) instead of lora_alpha / r, so s stays put while xAB grows like √r.
answer_p4 = 16 * math.sqrt(64) / (16 * math.sqrt(4))
