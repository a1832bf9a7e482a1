# Your answer goes in `answer_p1` (decimal GB).
# Typical mistake: "4-bit" read as 4 bytes per base weight.
n, vocab, hidden, a = 6.74e9, 32_000, 4_096, 40e6
kept = 2 * vocab * hidden
answer_p1 = ((n - kept) * 4 + kept * 4 + a * 16) / 1e9
