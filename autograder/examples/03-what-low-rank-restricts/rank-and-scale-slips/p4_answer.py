# Your answer goes in `answer_p4`.
# Typical mistake: the update scaled by lora_alpha (16) instead of lora_alpha / r (2).
answer_p4 = 16 * 32
