# Your answer goes in `answer_p4`.
answer_p4 = walk.run_walk(**ex, steps=1)[0].dB
