# Typical mistake: a zero gradient is taken to mean "AdamW leaves it alone".
answer_p3 = 2.5
