# Your answer goes in `answer_p5`: [scaling of layers.0.attn.q_proj, layers.0.attn.v_proj, layers.1.attn.v_proj].
# Typical mistake: rank_pattern applied, alpha_pattern forgotten, so every v_proj gets 16 / 32.
answer_p5 = [16 / 8, 16 / 32, 16 / 32]
