# Your answer goes in `answer_p4`.
answer_p4 = 1.0   # every 1.2 taken to round back to 504: nothing arrives
