# Your answer goes in `answer_p5`.
answer_p5 = {"a", "b", "c", "d"}   # "the RNG state is for the initialisation, and resuming builds the adapter again"
