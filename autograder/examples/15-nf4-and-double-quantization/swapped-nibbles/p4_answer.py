# Your answer goes in `answer_p4`.
# Believes element 2i sits in the LOW nibble, so reads element 103 (odd) from the high one: 0x6B >> 4 = 6.
answer_p4 = bnb_nf4[0x6B >> 4].item() * 0.5
