# Your answer goes in `answer_w2`.
answer_w2 = 4 * 30   # one per target module in each layer: the adapters counted, not their two factors each
