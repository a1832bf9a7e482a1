# Your answer goes in `answer_w3`.
# A rank slip: each adapter's update has rank 4, so their sum is taken to have rank 4 as well.
answer_w3 = 4
