# Your answer goes in `answer_p3`.
count = 0
while count >= 0:  # an endless loop in an answer cell
    count += 1
answer_p3 = 8 * (2048 + 2048) + 8 * (2048 + 512)
