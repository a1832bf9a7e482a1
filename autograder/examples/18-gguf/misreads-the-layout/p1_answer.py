# Your answer goes in `answer_p1`.
# Takes Q4_1 to be cheap enough to untie the embedding for free, and the levels to span the block exactly.
answer_p1 = {"a", "b", "f"}
