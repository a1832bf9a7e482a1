# Your answer goes in `answer_p6`.
# Typical mistake: the file is called Q4_1, so the embedding is sized as Q4_1 (20 bytes per 32 weights).
answer_p6 = 49152 * 960 * 5 / 8
