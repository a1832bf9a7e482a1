# Your answer goes in `answer_w3`.
# Same misconception: if the scale were lora_alpha alone, changing r would not change it.
answer_w3 = 1
