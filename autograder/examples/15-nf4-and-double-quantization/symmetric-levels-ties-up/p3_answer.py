# Your answer goes in `answer_p3`.
# w[128] is alone in the last block: -0.3 / 0.3 = -1, code 0. The padding is a 0, exactly between the two middle
# levels of the (symmetric) table: a tie, rounded up like the others.
answer_p3 = [0, 8]
