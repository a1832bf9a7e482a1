# Your answer goes in `answer_p3`.
count = 0
while count >= 0:  # an endless loop in an answer cell
    count += 1
answer_p3 = (32 / 16 ** 0.5) / (32 / 16)
