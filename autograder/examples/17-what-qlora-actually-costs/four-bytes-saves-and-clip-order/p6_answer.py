# Your answer goes in `answer_p6`.
# Typical mistake: a frozen layer on the gradient's way to an adapter taken to save all it saved with an adapter of its own.
answer_p6 = "a"
