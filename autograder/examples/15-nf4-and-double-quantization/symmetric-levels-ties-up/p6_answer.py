# Your answer goes in `answer_p6`.
answer_p6 = 4 + 32 / 32 + 32 / (32 * 256)   # every block's absmax still counted as 32 bits
